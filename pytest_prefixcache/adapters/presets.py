"""Zero-argument factories for the HTTP adapter, to name on the command line
(``--prefixcache-engine=pytest_prefixcache.adapters.presets:reference_server``).

Each starts its own servers on 127.0.0.1 and stops them at ``close()`` or interpreter exit.
The zero-argument ones load ``model_dir`` when given, else the model ``PREFIXCACHE_MODEL``
names (``--prefixcache-model``), else their tiny fixture; a model of the wrong kind (a
vision-language model for a text-only server, or the reverse) is refused before any server
starts.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from typing import Any

from ..errors import EngineError
from ..package_data import engine_model
from .environment import audit_share, concurrency_from_env, value
from .http.claims import ClaimWatch, sources_from_json
from .http.openai import OpenAIEngine
from .http.render import TextRenderer, VlmRenderer
from .llama import llama_server
from .omlx import omlx_server
from .sglang import sglang_server
from .tolerances import model_dir_of, with_measured_rules
from .vllm import VLLM_ENV, VLLM_RESETS, vllm_matrix_engine, vllm_server

__all__ = [
    "TAP",
    "VLLM_ENV",
    "VLLM_RESETS",
    "audit_share",
    "from_env",
    "llama_server",
    "mlx_lm_server",
    "mlx_vlm_server",
    "omlx_server",
    "reference_server",
    "sglang_server",
    "vllm_matrix_engine",
    "vllm_server",
]

#: The launcher prefix that runs a server's CLI function under the logit tap.
TAP = "{python} -m pytest_prefixcache.tap"


def reference_server(
    model_dir: str | os.PathLike[str] | None = None, *, concurrency: int | None = None
) -> OpenAIEngine:
    """The reference engine's HTTP front end on ``model_dir`` (default: ``PREFIXCACHE_MODEL``,
    else the tiny Qwen2-VL); cold = a reset second server; namespaces by
    ``x-prefixcache-namespace``; full logits, token ids, image spans and the served order
    through the server's ``prefixcache`` reply extension. ``concurrency``: requests sent at
    once (default: ``PREFIXCACHE_CONCURRENCY``, else 1; the server serves up to 4)."""
    model = engine_model(
        model_dir, default="tiny-qwen2-vl", vision=True, who="the reference server"
    )
    cmd = (
        f"{{python}} -m reference_engine.server --model {shlex.quote(str(model))} "
        "--host 127.0.0.1 --port {port}"
    )
    return OpenAIEngine(
        cmd,
        cold="reset",
        namespace_header="x-prefixcache-namespace",
        top_logprobs=20,
        extensions=True,
        concurrency=concurrency_from_env() if concurrency is None else concurrency,
    )


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

    ``cold_module``: a module whose ``main`` serves as ``mlx_lm.server`` with no prompt cache,
    the cold server of versions without ``--prompt-cache-size`` (before 0.31.0; the public
    record's ``engines.history.history_nocache``); ``body``: fields added to every request
    (``{"logprobs": -1}`` for mlx-lm 0.30, whose batch loop fails on any logprobs count)."""
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
            "--port {port}" + "".join(f" {shlex.quote(w)}" for f in flags for w in shlex.split(f))
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
        check_labels=False,  # mlx-lm 0.32.2 labels a step with an unsorted top-k's first entry
        concurrency=n,
    )
    return with_measured_rules(engine, cmd)  # the rule from_env derives from the same command


def mlx_vlm_server(
    model_dir: str | os.PathLike[str] | None = None,
    *,
    claims: ClaimWatch | None = None,
    concurrency: int | None = None,
    flags: Sequence[str] = (),
    images: bool = True,
) -> OpenAIEngine:
    """``mlx_vlm.server`` with APC (disk tier off) on ``model_dir`` (a vision-language model;
    default: ``PREFIXCACHE_MODEL``, else the tiny Qwen2-VL) under the logit tap; cold = a
    fresh ``x-apc-tenant`` salt on the same server; token ids and image spans rendered
    locally; ``claims``: the claim sources to check (see :mod:`.claims`); ``flags``: serve
    flags a matrix combination passes (``--prefill-step-size 32``), each a command-line
    string; ``images=False``: text requests only (its image requests reuse nothing).
    ``concurrency``: requests sent at once (default: ``PREFIXCACHE_CONCURRENCY``, else 1; its
    continuous batching serves them in one BatchGenerator)."""
    model = engine_model(model_dir, default="tiny-qwen2-vl", vision=True, who="mlx_vlm.server")
    cmd = (
        f"{TAP} mlx_vlm.server.cli:main --model {shlex.quote(str(model))} --host 127.0.0.1 "
        "--port {port} --top-logprobs-k 20"
        + "".join(f" {shlex.quote(w)}" for f in flags for w in shlex.split(f))
    )
    engine = OpenAIEngine(
        cmd,
        cold="salt",
        namespace_header="x-apc-tenant",
        model=str(model),
        top_logprobs=20,
        tap=True,
        supports_images=images,
        vocab=model,
        env={"APC_ENABLED": "1", "APC_DISK_ENABLED": "0"},
        render=VlmRenderer(model),
        check_labels=False,
        claims=claims,
        concurrency=concurrency_from_env() if concurrency is None else concurrency,
    )
    return with_measured_rules(engine, cmd)


def from_env() -> OpenAIEngine:
    """An adapter configured by environment variables (used by engines/seed/run.sh and
    ``--prefixcache-server-cmd``): the ``PREFIXCACHE_*`` variables that
    :data:`.environment.VARIABLES` declares (``PREFIXCACHE_SERVER_CMD`` or
    ``PREFIXCACHE_SERVER_URL``, the cold baseline, resets, namespaces, ids, the tap, claims...),
    each with its default and parser there; a bad value is an error naming the variable.

    The measured tolerance rule is the one a preset of the same server gets
    (:func:`.tolerances.with_measured_rules`): the library from the command's program, the
    family from its ``--model`` directory, else ``PREFIXCACHE_RENDER``'s, ``PREFIXCACHE_VOCAB``'s
    or ``PREFIXCACHE_MODEL``'s.
    """
    e = os.environ
    cmd, url = value("PREFIXCACHE_SERVER_CMD"), value("PREFIXCACHE_SERVER_URL")
    if not cmd and not url:
        raise EngineError("set PREFIXCACHE_SERVER_CMD (with {port}) or PREFIXCACHE_SERVER_URL")
    env = dict(kv.split("=", 1) for kv in shlex.split(value("PREFIXCACHE_SERVER_ENV") or ""))
    kind, _, model_dir = (value("PREFIXCACHE_RENDER") or "").partition(":")
    if kind not in ("", "text", "vlm"):
        raise EngineError(f"PREFIXCACHE_RENDER={kind}:... is not text:DIR or vlm:DIR")
    render: TextRenderer | VlmRenderer | None = None
    if kind:
        render = TextRenderer(model_dir) if kind == "text" else VlmRenderer(model_dir)
    resets = f"{value('PREFIXCACHE_RESET_METHOD')} {value('PREFIXCACHE_RESET_PATH')}"
    sources = value("PREFIXCACHE_CLAIMS")
    engine = OpenAIEngine(
        cmd or None,
        url=None if cmd else url,
        cold=value("PREFIXCACHE_COLD"),
        cold_cmd=value("PREFIXCACHE_COLD_CMD"),
        reset_paths=value("PREFIXCACHE_RESET_PATHS") or resets,
        namespace_header=value("PREFIXCACHE_NAMESPACE_HEADER"),
        namespace_field=value("PREFIXCACHE_NAMESPACE_FIELD"),
        extra_body=value("PREFIXCACHE_EXTRA_BODY"),
        prompt_ids=value("PREFIXCACHE_PROMPT_IDS"),
        image_token_id=value("PREFIXCACHE_IMAGE_TOKEN_ID"),
        check_labels=value("PREFIXCACHE_CHECK_LABELS"),
        model=value("PREFIXCACHE_MODEL"),
        top_logprobs=value("PREFIXCACHE_TOP_LOGPROBS"),
        tap=value("PREFIXCACHE_TAP_SERVER"),
        vocab=value("PREFIXCACHE_VOCAB"),
        supports_images=not value("PREFIXCACHE_TEXT_ONLY"),
        env=env,
        start_timeout=value("PREFIXCACHE_START_TIMEOUT"),
        render=render,
        tap_log=value("PREFIXCACHE_TAP_LOG"),
        extensions=value("PREFIXCACHE_EXTENSIONS"),
        audit=value("PREFIXCACHE_AUDIT"),
        fork=value("PREFIXCACHE_FORK"),
        reuse_reference=value("PREFIXCACHE_REUSE_REFERENCE"),
        block_size=value("PREFIXCACHE_BLOCK_SIZE"),
        concurrency=concurrency_from_env(),
        claims=ClaimWatch(
            sources_from_json(sources), decode_steps=value("PREFIXCACHE_DECODE_STEPS")
        )
        if sources
        else None,
    )
    engine.fresh_instance_share = audit_share("PREFIXCACHE_AUDIT_SHARE")
    # the measured rule of the program the command runs on the model's family, as a preset
    # of the same server gets it: the model directory is the command's --model, else the one
    # the ids are rendered with, the vocabulary's, or PREFIXCACHE_MODEL's
    candidates = (model_dir_of(cmd or ""), model_dir, e.get("PREFIXCACHE_VOCAB", ""))
    found = next((d for d in (*candidates, e.get("PREFIXCACHE_MODEL", "")) if _is_dir(d)), None)
    return with_measured_rules(engine, cmd, model_dir=found)


def _is_dir(path: str) -> bool:
    return bool(path) and os.path.isdir(path)
