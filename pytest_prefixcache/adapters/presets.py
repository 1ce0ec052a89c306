"""Zero-argument factories for the HTTP adapter, to name on the command line
(``--prefixcache-engine=pytest_prefixcache.adapters.presets:reference_server``).

Each starts its own servers on 127.0.0.1 and stops them at ``close()`` or interpreter exit.
"""

from __future__ import annotations

import os
import shlex

from ..errors import EngineError
from .chat import FIXTURES
from .claims import ClaimWatch, sources_from_json
from .openai import OpenAIEngine
from .render import TextRenderer, VlmRenderer

__all__ = [
    "TAP",
    "from_env",
    "mlx_lm_server",
    "mlx_vlm_server",
    "reference_server",
]

#: The launcher prefix that runs a server's CLI function under the logit tap.
TAP = "{python} -m pytest_prefixcache.tap"


def reference_server() -> OpenAIEngine:
    """The reference engine's HTTP front end on the tiny Qwen2-VL; cold = a reset second
    server; namespaces by ``x-prefixcache-namespace``; full logits, token ids and image spans
    through the server's ``prefixcache`` reply extension."""
    cmd = "{python} -m reference_engine.server --host 127.0.0.1 --port {port}"
    return OpenAIEngine(
        cmd,
        cold="reset",
        namespace_header="x-prefixcache-namespace",
        top_logprobs=20,
        extensions=True,
    )


def mlx_lm_server() -> OpenAIEngine:
    """``mlx_lm.server`` on the tiny Llama under the logit tap; cold = a second server with
    ``--prompt-cache-size 0``; token ids rendered locally. Text only; it has no namespaces."""
    model = FIXTURES / "tiny-llama"
    cmd = f"{TAP} mlx_lm.server:main --model {model} --host 127.0.0.1 --port {{port}}"
    return OpenAIEngine(
        cmd,
        cold="server",
        cold_cmd=cmd + " --prompt-cache-size 0",
        supports_images=False,
        tap=True,
        render=TextRenderer(model),
    )


def mlx_vlm_server() -> OpenAIEngine:
    """``mlx_vlm.server`` with APC (disk tier off) on the tiny Qwen2-VL under the logit tap;
    cold = a fresh ``x-apc-tenant`` salt on the same server; token ids and image spans
    rendered locally."""
    model = FIXTURES / "tiny-qwen2-vl"
    cmd = (
        f"{TAP} mlx_vlm.server.cli:main --model {model} --host 127.0.0.1 --port {{port}} "
        "--top-logprobs-k 20"
    )
    return OpenAIEngine(
        cmd,
        cold="salt",
        namespace_header="x-apc-tenant",
        model=str(model),
        top_logprobs=20,
        tap=True,
        vocab=model,
        env={"APC_ENABLED": "1", "APC_DISK_ENABLED": "0"},
        render=VlmRenderer(model),
    )


def from_env() -> OpenAIEngine:
    """An adapter configured by environment variables (used by scripts/seed_engines.sh):

    ``PREFIXCACHE_SERVER_CMD`` or ``PREFIXCACHE_SERVER_URL``; ``PREFIXCACHE_COLD``
    (restart/reset/server/salt, default restart); ``PREFIXCACHE_COLD_CMD``;
    ``PREFIXCACHE_RESET_PATH`` and ``PREFIXCACHE_RESET_METHOD``;
    ``PREFIXCACHE_NAMESPACE_HEADER``; ``PREFIXCACHE_MODEL``; ``PREFIXCACHE_TOP_LOGPROBS``
    (default 10); ``PREFIXCACHE_TAP_SERVER=1`` (the commands start the tap launcher);
    ``PREFIXCACHE_VOCAB`` (a model directory); ``PREFIXCACHE_TEXT_ONLY=1``; and
    ``PREFIXCACHE_SERVER_ENV`` (``K=V K=V`` for the servers); ``PREFIXCACHE_RENDER``
    (``text:DIR`` or ``vlm:DIR``: render token ids locally with that model directory);
    ``PREFIXCACHE_TAP_LOG`` (a JSON-lines file of the API's vs the tap's reuse per request);
    ``PREFIXCACHE_CLAIMS`` (claim sources as JSON, see :func:`.claims.sources_from_json`) and
    ``PREFIXCACHE_DECODE_STEPS`` (tokens asked for under the tap, default 8).
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
    return OpenAIEngine(
        cmd or None,
        url=None if cmd else url,
        cold=e.get("PREFIXCACHE_COLD", "restart"),  # type: ignore[arg-type]
        cold_cmd=e.get("PREFIXCACHE_COLD_CMD") or None,
        reset_path=e.get("PREFIXCACHE_RESET_PATH", "/v1/cache/reset"),
        reset_method=e.get("PREFIXCACHE_RESET_METHOD", "POST"),
        namespace_header=e.get("PREFIXCACHE_NAMESPACE_HEADER") or None,
        model=e.get("PREFIXCACHE_MODEL") or None,
        top_logprobs=int(e.get("PREFIXCACHE_TOP_LOGPROBS", "10")),
        tap=e.get("PREFIXCACHE_TAP_SERVER") == "1",
        vocab=e.get("PREFIXCACHE_VOCAB") or None,
        supports_images=e.get("PREFIXCACHE_TEXT_ONLY") != "1",
        env=env,
        start_timeout=float(e.get("PREFIXCACHE_START_TIMEOUT", "180")),
        render=render,
        tap_log=e.get("PREFIXCACHE_TAP_LOG") or None,
        claims=ClaimWatch(
            sources_from_json(e["PREFIXCACHE_CLAIMS"]),
            decode_steps=int(e.get("PREFIXCACHE_DECODE_STEPS", "8")),
        )
        if e.get("PREFIXCACHE_CLAIMS")
        else None,
    )
