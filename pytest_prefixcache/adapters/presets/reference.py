"""The reference engine's HTTP front end (``python -m reference_engine.server``)."""

from __future__ import annotations

import os
import shlex

from ...package_data import engine_model
from ..environment import concurrency_from_env
from ..http.openai import OpenAIEngine

__all__ = ["reference_server"]


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
