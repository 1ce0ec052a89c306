"""``mlx_vlm.server`` with APC under the logit tap (notes: engines/mlx-vlm/NOTES.md)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from ...package_data import engine_model
from ..environment import concurrency_from_env
from ..http.claims import ClaimWatch
from ..http.openai import OpenAIEngine
from ..http.render import VlmRenderer
from ..tolerances import with_measured_rules
from .common import TAP, quoted_flags

__all__ = ["mlx_vlm_server"]


def mlx_vlm_server(
    model_dir: str | os.PathLike[str] | None = None,
    *,
    claims: ClaimWatch | None = None,
    concurrency: int | None = None,
    flags: Sequence[str] = (),
    images: bool = True,
    tap: bool = True,
) -> OpenAIEngine:
    """``mlx_vlm.server`` with APC (disk tier off) on ``model_dir`` (a vision-language model;
    default: ``PREFIXCACHE_MODEL``, else the tiny Qwen2-VL) under the logit tap; cold = a
    fresh ``x-apc-tenant`` salt on the same server; token ids and image spans rendered
    locally; ``claims``: the claim sources to check (see :mod:`.claims`); ``flags``: serve
    flags a matrix combination passes (``--prefill-step-size 32``), each a command-line
    string; ``images=False``: text requests only (its image requests reuse nothing).
    ``concurrency``: requests sent at once (default: ``PREFIXCACHE_CONCURRENCY``, else 1; its
    continuous batching serves them in one BatchGenerator). ``tap=False``: ``python -m
    mlx_vlm.server``, no tap: the logits are then the API's ``top_logprobs`` (20) and the
    reuse its ``cached_tokens``, with no batch row tied to its request (the public record
    runs versions on which the tap's attribution guesses: engines/history/bugs.toml)."""
    model = engine_model(model_dir, default="tiny-qwen2-vl", vision=True, who="mlx_vlm.server")
    cmd = (
        f"{TAP + ' mlx_vlm.server.cli:main' if tap else '{python} -m mlx_vlm.server'} "
        f"--model {shlex.quote(str(model))} --host 127.0.0.1 "
        "--port {port} --top-logprobs-k 20" + quoted_flags(flags)
    )
    engine = OpenAIEngine(
        cmd,
        cold="salt",
        namespace_header="x-apc-tenant",
        model=str(model),
        top_logprobs=20,
        tap=tap,
        supports_images=images,
        vocab=model,
        env={"APC_ENABLED": "1", "APC_DISK_ENABLED": "0"},
        render=VlmRenderer(model),
        check_labels=False,
        claims=claims,
        concurrency=concurrency_from_env() if concurrency is None else concurrency,
    )
    return with_measured_rules(engine, cmd)
