"""``mlx_lm.server`` under the logit tap (notes: engines/mlx-lm/NOTES.md)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from typing import Any

from ...package_data import engine_model
from ..environment import concurrency_from_env
from ..http.openai import OpenAIEngine
from ..http.render import TextRenderer
from ..tolerances import with_measured_rules
from .common import TAP, quoted_flags

__all__ = ["mlx_lm_server"]


def mlx_lm_server(
    model_dir: str | os.PathLike[str] | None = None,
    *,
    concurrency: int | None = None,
    tap: bool = True,
    flags: Sequence[str] = (),
    draft_model: str | os.PathLike[str] | None = None,
    num_draft_tokens: int = 3,
    cold_module: str = "",
    body: dict[str, Any] | None = None,
) -> OpenAIEngine:
    """``mlx_lm.server`` on ``model_dir`` (a text model; default: ``PREFIXCACHE_MODEL``, else
    the tiny Llama) under the logit tap; cold = a second server with ``--prompt-cache-size
    0``; token ids rendered locally. Text only; it has no namespaces. ``concurrency``:
    requests sent at once (default: ``PREFIXCACHE_CONCURRENCY``, else 1; its BatchGenerator
    batches them: ``--decode-concurrency``, ``--prompt-concurrency`` among ``flags``, serve
    flags a matrix combination passes, each a command-line string).
    The tap labels each batch row with its request's BatchGenerator uid and ties it to the
    reply's id (``Outcome.attribution == "id"``); ``tap=False``: none, the logits are then the
    API's ``top_logprobs`` (10; it refuses 20) and the reuse its ``cached_tokens``.
    ``draft_model`` (a fixture name or directory, e.g. ``tiny-llama-draft``): speculative
    decoding (``--draft-model``, ``--num-draft-tokens``; the server then serves one request
    at a time), judged against a cold server without the draft.

    ``cold_module``: a module whose ``main`` serves as ``mlx_lm.server`` with no prompt cache
    (the cold server of an old version without ``--prompt-cache-size``); ``body``: fields added
    to every request. Which versions need either: engines/mlx-lm/NOTES.md."""
    model = engine_model(model_dir, default="tiny-llama", vision=False, who="mlx_lm.server")
    n = concurrency_from_env() if concurrency is None else concurrency
    spec = ""
    if draft_model is not None:
        draft = engine_model(draft_model, default="", vision=False, who="--draft-model")
        spec = f" --draft-model {shlex.quote(str(draft))} --num-draft-tokens {num_draft_tokens:d}"

    def serve(module: str) -> str:
        return (
            f"{TAP if tap else '{python} -m'} {module}"
            f"{':main' if tap else ''} --model {shlex.quote(str(model))} --host 127.0.0.1 "
            "--port {port}" + quoted_flags(flags)
        )

    cmd = serve("mlx_lm.server")
    engine = OpenAIEngine(
        cmd + spec,
        cold="server",
        cold_cmd=serve(cold_module) if cold_module else cmd + " --prompt-cache-size 0",
        extra_body=dict(body or {}),
        supports_images=False,
        tap=tap,
        render=TextRenderer(model),
        check_labels=False,  # its top_logprobs labels: engines/mlx-lm/NOTES.md
        concurrency=n,
    )
    return with_measured_rules(engine, cmd)  # the rule from_env derives from the same command
