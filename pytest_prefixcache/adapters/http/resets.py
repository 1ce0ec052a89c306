"""Cache resets over HTTP, judged by the reply body as well as the status.

A reset endpoint is ``"METHOD /path"`` (or ``"/path"`` for POST). A server can need several
(vLLM: ``/reset_prefix_cache``, ``/reset_mm_cache``, ``/reset_encoder_cache``). A reset
succeeded when it answered 2xx and its body does not say otherwise: vLLM answers 200
``{"success": false}`` when it could not reset, which is a failure here, never a reset.
``"restart"`` in place of an endpoint: no endpoint empties the server's cache, a restart does
(rapid-mlx 0.12's ``/v1/cache/clear`` and ``DELETE /v1/cache`` leave its prefix cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import EngineError
from .server import connection_problem, http_json

__all__ = ["RESTART", "Endpoint", "endpoints", "refusal", "reset_caches"]

#: The reset spec that means "restart the server" (no endpoint empties its cache).
RESTART = "restart"
#: Statuses that mean "this server has no such endpoint" (a restart can stand in for it).
ABSENT = (404, 405, 501)


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def endpoints(spec: Sequence[str] | str) -> tuple[Endpoint, ...]:
    """``"POST /a"``, ``"/b"`` or a list of them (a string may hold several, comma-separated);
    ``"restart"`` (:data:`RESTART`) for a server that only a restart empties."""
    items = [s for part in ([spec] if isinstance(spec, str) else spec) for s in part.split(",")]
    out = []
    for item in (s.strip() for s in items):
        if not item:
            continue
        if item.lower() == RESTART:
            out.append(Endpoint(RESTART.upper(), ""))
            continue
        method, _, path = item.rpartition(" ")
        method = method.strip().upper() or "POST"
        if not path.startswith("/"):
            raise ValueError(f"reset endpoint {item!r} is not 'METHOD /path' or '/path'")
        out.append(Endpoint(method, path))
    return tuple(out)


def refusal(status: int, reply: Any, tolerated: Sequence[str] = ()) -> str | None:
    """Why a reset reply is not a successful reset (None when it is one). ``tolerated``: the
    ``error`` texts that still mean a reset (a server that says it could not clear a cache it
    does not have, after clearing its own: vllm-mlx 0.6.0's DELETE /v1/cache)."""
    if not 200 <= status < 300:
        return f"answered {status}: {str(reply)[:300]}"
    if isinstance(reply, dict):
        if reply.get("success") is False or reply.get("ok") is False:
            return f"answered {status} but its body says it did not reset: {str(reply)[:300]}"
        if reply.get("error") and reply["error"] not in tolerated:
            return f"answered {status} with an error: {str(reply)[:300]}"
    return None


def reset_caches(
    base: str,
    resets: Sequence[Endpoint],
    timeout: float,
    *,
    can_restart: bool,
    tolerated: Sequence[str] = (),
) -> bool:
    """Call every reset endpoint of the server at ``base``, in order.

    Returns True when they all reset, False when a restart must stand in (the server is down,
    or has no such endpoint) and ``can_restart``. Raises EngineError when a reset is refused,
    or when the server cannot be reached and cannot be restarted; a reply whose ``error`` is
    one of ``tolerated`` still counts as a reset (see :func:`refusal`).
    """
    for ep in resets:
        if ep.method == RESTART.upper():
            if not can_restart:
                raise EngineError(f"cannot reset {base}: only a restart empties its cache")
            return False
        try:
            status, reply = http_json(ep.method, base + ep.path, {}, timeout=timeout)
        except OSError as exc:
            if not can_restart:
                raise EngineError(
                    f"cannot reset {base}: {ep}: {connection_problem(exc, base)}"
                ) from exc
            return False  # a dead server: a restart empties the cache
        if status in ABSENT and can_restart:
            return False  # no such endpoint: a restart empties the cache
        why = refusal(status, reply, tolerated)
        if why is not None:
            raise EngineError(f"the cache reset {ep} of {base} failed: it {why}")
    return True
