"""Driving request streams with restarts (``--prefixcache-restarts``).

Between two requests a :class:`~pytest_prefixcache.strategies.Restart` asks the engine to
stop and start again through its declared ``restart(changed)`` (in-process: a new instance
over the same storage; a server: the same command, the same storage path). Every request
after it is checked as any other: whatever the engine restores must equal cold, within the
bound. After a restart with something changed, the verifier forgets the stream's tokens (the
oracle starts again) and judges ``stale identity`` first (:mod:`..checks.restart`); the
baseline audit goes on where the engine's own ``fresh_instance`` builds its fresh instances
(they follow the change), else it pauses for the rest of the stream (a fresh instance of the
old configuration is no baseline; the coverage table shows the gap). A failure's message
lists the stream's restarts, and its saved stream keeps them (``meta["restarts"]``: [request
index, what changed]; ``restarts_from`` puts them back for a replay).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from .. import errors
from ..checks.coverage import APPLIED
from ..checks.restart import NOT_DECLARED, RESTART
from ..strategies import Restart
from ..traits import optional_method, traits_of
from ..types import Request
from .messages import Context
from .options import Step
from .verifier import Verifier

__all__ = [
    "declares_restart",
    "restart",
    "restart_changes",
    "restarts_from",
    "run_restart_stream",
]


def declares_restart(engine: object) -> bool:
    """The engine declares ``restart(changed)`` and ``persists = True`` (its cache outlives a
    restart: an engine without storage restores nothing, and its restarts test nothing)."""
    return optional_method(engine, "restart") is not None and traits_of(engine).persists is True


def restart_changes(engine: object) -> tuple[str, ...]:
    """What the engine says a restart may change (``restart_changes``; none when absent)."""
    changes = traits_of(engine).restart_changes
    if isinstance(changes, str) or not all(isinstance(c, str) and c for c in changes):
        raise errors.EngineError(
            f"{type(engine).__name__}.restart_changes = {changes!r}: must be a tuple of names "
            "of what a restart may change"
        )
    return tuple(changes)


def restart(verifier: Verifier, changed: str | None) -> None:
    """Restart the verifier's engine between two requests, with ``changed`` changed."""
    __tracebackhide__ = True
    fn = optional_method(verifier.engine, "restart")
    if fn is None:
        verifier.report.count(RESTART, NOT_DECLARED)
        return
    ctx = Context(tuple(verifier.stream), max(0, len(verifier.stream) - 1))
    what = "restart()" if changed is None else f"restart(changed={changed!r})"
    verifier._call(what, functools.partial(fn, changed), ctx)
    verifier.report.count(RESTART, APPLIED)
    if changed is not None:
        verifier.oracle.reset()
        verifier.changed_since = changed
        if getattr(verifier.audit.fresh, "__self__", None) is not verifier.engine:
            # fresh instances of the old configuration: no baseline until the stream ends
            verifier.audit.fresh = None
            verifier.audit.missing = f"restarted with the {changed} changed"


def run_restart_stream(
    verifier: Verifier, items: Sequence[Request | Restart], *, reset: bool = True
) -> list[Step]:
    """Reset (by default), then run each request and restart where the stream says."""
    __tracebackhide__ = True
    if reset:
        verifier.reset()
    audit = (verifier.audit.fresh, verifier.audit.missing)
    done: list[tuple[int, str | None]] = []
    steps: list[Step] = []
    try:
        for item in items:
            if isinstance(item, Restart):
                restart(verifier, item.changed)
                done.append((len(verifier.stream), item.changed))
            else:
                steps.append(verifier.step(item))
        verifier.finish()
    except errors.VerificationFailure as exc:
        if not done:
            raise
        said = ", ".join(
            f"before request {i} ({'same configuration' if c is None else c + ' changed'})"
            for i, c in done
        )
        raise type(exc)(
            f"{exc}\n  restarts in this stream: {said}",
            stream=exc.stream,
            request_index=exc.request_index,
            replay_path=exc.replay_path,
            meta={**exc.meta, "restarts": [[i, c] for i, c in done]},
        ) from None
    finally:
        verifier.audit.fresh, verifier.audit.missing = audit
        verifier.changed_since = None
    return steps


def restarts_from(
    stream: Sequence[Request], meta: Mapping[str, Any]
) -> tuple[Request | Restart, ...] | None:
    """A saved stream's requests with its restarts (``meta["restarts"]``: [index, changed]
    pairs, a restart before request ``index``) put back; None when it has none."""
    saved = meta.get("restarts")
    if saved is None:
        return None
    before: dict[int, list[Restart]] = {}
    if not isinstance(saved, list):
        raise errors.PrefixCacheError(
            f"restarts: expected a list of [index, changed], got {saved!r}"
        )
    for k, pair in enumerate(saved):
        ok = isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int)
        if (
            not ok
            or not 0 < pair[0] < len(stream)
            or not (pair[1] is None or isinstance(pair[1], str))
        ):
            raise errors.PrefixCacheError(
                f"restarts[{k}]: expected [request index 1..{len(stream) - 1}, what changed "
                "or null], "
                f"got {pair!r}"
            )
        before.setdefault(pair[0], []).append(Restart(pair[1]))
    out: list[Request | Restart] = []
    for i, request in enumerate(stream):
        out += before.get(i, [])
        out.append(request)
    return tuple(out)
