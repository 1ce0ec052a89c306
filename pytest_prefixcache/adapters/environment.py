"""The environment variables every preset reads the same way: ``PREFIXCACHE_CONCURRENCY`` and
the audit shares. Below the presets (``presets``, ``omlx``, ``seed``), so that each imports them
without importing another preset."""

from __future__ import annotations

import os

from ..errors import EngineError

__all__ = ["audit_share", "concurrency_from_env"]


def concurrency_from_env() -> int:
    """``PREFIXCACHE_CONCURRENCY``: requests a server is sent at once (default 1)."""
    value = os.environ.get("PREFIXCACHE_CONCURRENCY", "1").strip()
    if not value.isdigit() or int(value) < 1:
        raise EngineError(f"PREFIXCACHE_CONCURRENCY={value!r} is not an int >= 1")
    return int(value)


def audit_share(name: str, default: str) -> int:
    """The environment variable ``name`` (audited requests one fresh server may answer), an
    int >= 1, else an :class:`EngineError` naming it."""
    value = os.environ.get(name, default)
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise EngineError(f"{name}={value!r} is not an integer >= 1")
    return n
