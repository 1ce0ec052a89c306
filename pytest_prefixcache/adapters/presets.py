"""Zero-argument factories for the HTTP adapter, to name on the command line
(``--prefixcache-engine=pytest_prefixcache.adapters.presets:reference_server``).

Each starts its own servers on 127.0.0.1 and stops them at ``close()`` or interpreter exit.
The zero-argument ones load ``model_dir`` when given, else the model ``PREFIXCACHE_MODEL``
names (``--prefixcache-model``), else their tiny fixture; a model of the wrong kind (a
vision-language model for a text-only server, or the reverse) is refused before any server
starts.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from typing import Any

from ..errors import EngineError
from ..package_data import engine_model
from .environment import audit_share, concurrency_from_env
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
    ``cold_module``: a module whose ``main`` serves as ``mlx_lm.server`` with no prompt cache,
    the cold server of versions without ``--prompt-cache-size`` (before 0.31.0; the public
    record's ``engines.history.history_nocache``); ``body``: fields added to every request
    (``{"logprobs": -1}`` for mlx-lm 0.30, whose batch loop fails on any logprobs count)."""
    model = engine_model(model_dir, default="tiny-llama", vision=False, who="mlx_lm.server")
    n = concurrency_from_env() if concurrency is None else concurrency

    def serve(module: str) -> str:
        return (
            f"{TAP if tap else '{python} -m'} {module}"
            f"{':main' if tap else ''} --model {shlex.quote(str(model))} --host 127.0.0.1 "
            "--port {port}" + "".join(f" {shlex.quote(w)}" for f in flags for w in shlex.split(f))
        )

    cmd = serve("mlx_lm.server")
    engine = OpenAIEngine(
        cmd,
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
    flags: Sequence[str] = (),
    images: bool = True,
) -> OpenAIEngine:
    """``mlx_vlm.server`` with APC (disk tier off) on ``model_dir`` (a vision-language model;
    default: ``PREFIXCACHE_MODEL``, else the tiny Qwen2-VL) under the logit tap; cold = a
    fresh ``x-apc-tenant`` salt on the same server; token ids and image spans rendered
    locally; ``claims``: the claim sources to check (see :mod:`.claims`); ``flags``: serve
    flags a matrix combination passes (``--prefill-step-size 32``), each a command-line
    string; ``images=False``: text requests only (its image requests reuse nothing)."""
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
    )
    return with_measured_rules(engine, cmd)


def _json_object(name: str) -> dict[str, Any]:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise EngineError(f"{name} is not JSON: {exc}: {raw[:200]}") from None
    if not isinstance(value, dict):
        raise EngineError(f"{name} must be a JSON object, not {raw[:200]}")
    return value


def from_env() -> OpenAIEngine:
    """An adapter configured by environment variables (used by engines/seed/run.sh and
    ``--prefixcache-server-cmd``):

    ``PREFIXCACHE_SERVER_CMD`` or ``PREFIXCACHE_SERVER_URL``; ``PREFIXCACHE_COLD``
    (reset/restart/server/salt, default reset); ``PREFIXCACHE_COLD_CMD``;
    ``PREFIXCACHE_RESET_PATHS`` (comma-separated ``METHOD /path``; default
    ``PREFIXCACHE_RESET_METHOD`` ``PREFIXCACHE_RESET_PATH``, ``POST /v1/cache/reset``);
    ``PREFIXCACHE_NAMESPACE_HEADER`` and/or ``PREFIXCACHE_NAMESPACE_FIELD`` (vLLM:
    ``cache_salt``); ``PREFIXCACHE_EXTRA_BODY`` (a JSON object added to every request body);
    ``PREFIXCACHE_PROMPT_IDS`` (``reply`` or ``tokenize``) and ``PREFIXCACHE_IMAGE_TOKEN_ID``;
    ``PREFIXCACHE_CHECK_LABELS=0``; ``PREFIXCACHE_MODEL`` (the ``model`` field sent: the
    directory of ``--prefixcache-model``, or a served model's name); ``PREFIXCACHE_TOP_LOGPROBS``
    (default 10); ``PREFIXCACHE_TAP_SERVER=1`` (the commands start the tap launcher);
    ``PREFIXCACHE_VOCAB`` (a model directory); ``PREFIXCACHE_TEXT_ONLY=1``;
    ``PREFIXCACHE_SERVER_ENV`` (``K=V K=V`` for the servers); ``PREFIXCACHE_RENDER``
    (``text:DIR`` or ``vlm:DIR``: render token ids locally with that model directory);
    ``PREFIXCACHE_START_TIMEOUT`` (default 180); ``PREFIXCACHE_EXTENSIONS=1`` (the reference
    server's ``prefixcache`` reply object: token ids, spans, merges, message starts, logits);
    ``PREFIXCACHE_TAP_LOG`` (a JSON-lines file of the API's vs the tap's reuse per request);
    ``PREFIXCACHE_AUDIT=0`` (no fresh servers for the baseline audit: coverage is partial);
    ``PREFIXCACHE_FORK=0`` or ``1`` (start every server from scratch, or fork it; default: fork
    on Linux, see :mod:`.fresh`);
    ``PREFIXCACHE_CLAIMS`` (claim sources as JSON, see :func:`.claims.sources_from_json`);
    ``PREFIXCACHE_DECODE_STEPS`` (tokens asked for under the tap, default 8);
    ``PREFIXCACHE_REUSE_REFERENCE`` (``token``, ``snapshot`` or ``block``: the cache's design,
    default token) and ``PREFIXCACHE_BLOCK_SIZE`` (with ``block``); ``PREFIXCACHE_CONCURRENCY``
    (requests the server serves at once, default 1: above 1 the waves property runs).

    The measured tolerance rule is the one a preset of the same server gets
    (:func:`.tolerances.with_measured_rules`): the library from the command's program, the
    family from its ``--model`` directory, else ``PREFIXCACHE_RENDER``'s, ``PREFIXCACHE_VOCAB``'s
    or ``PREFIXCACHE_MODEL``'s.
    """
    e = os.environ
    cmd, url = e.get("PREFIXCACHE_SERVER_CMD"), e.get("PREFIXCACHE_SERVER_URL")
    if not cmd and not url:
        raise EngineError("set PREFIXCACHE_SERVER_CMD (with {port}) or PREFIXCACHE_SERVER_URL")
    env = dict(kv.split("=", 1) for kv in shlex.split(e.get("PREFIXCACHE_SERVER_ENV", "")))
    kind, _, model_dir = e.get("PREFIXCACHE_RENDER", "").partition(":")
    if kind not in ("", "text", "vlm"):
        raise EngineError(f"PREFIXCACHE_RENDER={kind}:... is not text:DIR or vlm:DIR")
    render: TextRenderer | VlmRenderer | None = None
    if kind:
        render = TextRenderer(model_dir) if kind == "text" else VlmRenderer(model_dir)
    image_token = e.get("PREFIXCACHE_IMAGE_TOKEN_ID")
    resets = f"{e.get('PREFIXCACHE_RESET_METHOD', 'POST')} " + e.get(
        "PREFIXCACHE_RESET_PATH", "/v1/cache/reset"
    )
    block = e.get("PREFIXCACHE_BLOCK_SIZE", "").strip()
    if block and not block.isdigit():
        raise EngineError(f"PREFIXCACHE_BLOCK_SIZE={block!r} is not a positive int")
    engine = OpenAIEngine(
        cmd or None,
        url=None if cmd else url,
        cold=e.get("PREFIXCACHE_COLD", "reset"),  # type: ignore[arg-type]
        cold_cmd=e.get("PREFIXCACHE_COLD_CMD") or None,
        reset_paths=e.get("PREFIXCACHE_RESET_PATHS") or resets,
        namespace_header=e.get("PREFIXCACHE_NAMESPACE_HEADER") or None,
        namespace_field=e.get("PREFIXCACHE_NAMESPACE_FIELD") or None,
        extra_body=_json_object("PREFIXCACHE_EXTRA_BODY"),
        prompt_ids=e.get("PREFIXCACHE_PROMPT_IDS") or None,  # type: ignore[arg-type]
        image_token_id=int(image_token) if image_token else None,
        check_labels=e.get("PREFIXCACHE_CHECK_LABELS", "1") != "0",
        model=e.get("PREFIXCACHE_MODEL") or None,
        top_logprobs=int(e.get("PREFIXCACHE_TOP_LOGPROBS", "10")),
        tap=e.get("PREFIXCACHE_TAP_SERVER") == "1",
        vocab=e.get("PREFIXCACHE_VOCAB") or None,
        supports_images=e.get("PREFIXCACHE_TEXT_ONLY") != "1",
        env=env,
        start_timeout=float(e.get("PREFIXCACHE_START_TIMEOUT", "180")),
        render=render,
        tap_log=e.get("PREFIXCACHE_TAP_LOG") or None,
        extensions=e.get("PREFIXCACHE_EXTENSIONS") == "1",
        audit=e.get("PREFIXCACHE_AUDIT", "1") != "0",
        fork={"0": False, "1": True}.get(e.get("PREFIXCACHE_FORK", "")),
        reuse_reference=e.get("PREFIXCACHE_REUSE_REFERENCE") or "token",
        block_size=int(block) if block else None,
        concurrency=concurrency_from_env(),
        claims=ClaimWatch(
            sources_from_json(e["PREFIXCACHE_CLAIMS"]),
            decode_steps=int(e.get("PREFIXCACHE_DECODE_STEPS", "8")),
        )
        if e.get("PREFIXCACHE_CLAIMS")
        else None,
    )
    engine.fresh_instance_share = audit_share("PREFIXCACHE_AUDIT_SHARE", "1")
    # the measured rule of the program the command runs on the model's family, as a preset
    # of the same server gets it: the model directory is the command's --model, else the one
    # the ids are rendered with, the vocabulary's, or PREFIXCACHE_MODEL's
    candidates = (model_dir_of(cmd or ""), model_dir, e.get("PREFIXCACHE_VOCAB", ""))
    found = next((d for d in (*candidates, e.get("PREFIXCACHE_MODEL", "")) if _is_dir(d)), None)
    return with_measured_rules(engine, cmd, model_dir=found)


def _is_dir(path: str) -> bool:
    return bool(path) and os.path.isdir(path)
