"""How an OpenAI-compatible server's uncached baseline is made (``OpenAIEngine(cold=...)``).

The uncached baseline (``cold=``):

- ``"reset"`` (default): a second server, reset (every ``reset_paths`` endpoint, judged by
  its reply body) before every uncached request; a server without a reset endpoint (404) is
  restarted instead.
- ``"restart"``: a second server restarted before every uncached request: cold by
  construction, slow.
- ``"server"``: a second server that keeps no cache (e.g. ``--prompt-cache-size 0``).
- ``"salt"``: the same server, with a fresh random namespace (``namespace_header`` and/or
  ``namespace_field``, e.g. vLLM's ``cache_salt``).
"""

from __future__ import annotations

from typing import Literal

from ...errors import EngineError

__all__ = ["COLD_MODES", "Cold", "check_baseline"]

Cold = Literal["restart", "reset", "server", "salt"]
COLD_MODES: tuple[Cold, ...] = ("restart", "reset", "server", "salt")


def check_baseline(
    *,
    cmd: object,
    url: str | None,
    cold: str,
    cold_cmd: object,
    cold_url: str | None,
    salted: bool,
    tap: bool,
) -> None:
    """Raise EngineError naming what is missing when ``cold`` cannot be made from these
    servers (``salted``: a namespace header or field is configured)."""
    if (cmd is None) == (url is None):
        raise EngineError("give exactly one of cmd (a server command line) or url")
    if cold not in COLD_MODES:
        raise EngineError(f"cold={cold!r} is not 'restart', 'reset', 'server' or 'salt'")
    if cold == "salt" and not salted:
        raise EngineError("cold='salt' needs namespace_header or namespace_field (the salt)")
    if cold == "restart" and cmd is None and cold_cmd is None:
        raise EngineError("cold='restart' needs cmd or cold_cmd (a server it can restart)")
    if cold in ("reset", "server") and cmd is None and cold_cmd is None and cold_url is None:
        raise EngineError(
            f"cold={cold!r} needs a second server (cold_url or cold_cmd), or cmd to start "
            "one; a server given by URL alone can use cold='salt'"
        )
    if tap and (cmd is None or (cold != "salt" and cold_url is not None)):
        raise EngineError("tap=True needs servers started here (cmd, cold_cmd)")
