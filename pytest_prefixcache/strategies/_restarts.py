"""The restart move: request streams with restarts of the engine between two requests.

A :class:`Restart` between two requests stops the engine and starts it again with the same
configuration (``changed`` None), or with one thing changed (``changed`` names it: the engine
declares what it can change, e.g. the reference engine's ``RESTART_CHANGES``). Draws shrink
toward no restart, then toward a restart with nothing changed. Each change is drawn at most
once a stream: changing the KV dtype twice may change it back, to an identity whose blocks
are valid again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ..types import Request
from ._streams import request_streams

__all__ = ["Restart", "restart_streams"]

#: The draw between two requests: no restart (first, so streams shrink toward it), a restart
#: with nothing changed, or one with something changed. Odds: NONE_ODDS : SAME_ODDS : 1 each.
NONE_ODDS, SAME_ODDS = 3, 2


@dataclass(frozen=True)
class Restart:
    """Stop the engine and start it again between two requests; ``changed``: what differs
    (None: the same configuration, the same storage)."""

    changed: str | None = None

    def __str__(self) -> str:
        return "restart" if self.changed is None else f"restart with the {self.changed} changed"


Item = Request | Restart


def restart_streams(
    *, changes: Sequence[str] = (), **kwargs: Any
) -> st.SearchStrategy[tuple[Item, ...]]:
    """Request streams (``request_streams(**kwargs)``) with restarts drawn between requests
    (never before the first one).

    Args:
        changes: what a restart may change (the engine's declared changes). Default: nothing.
        kwargs: the arguments of :func:`request_streams`.
    """
    if isinstance(changes, str) or not all(isinstance(c, str) and c for c in changes):
        raise InvalidArgument(f"changes={changes!r} must be a sequence of non-empty names")
    choices: list[str | None] = ["", *([""] * (NONE_ODDS - 1)), *([None] * SAME_ODDS)]
    choices += list(changes)
    streams = request_streams(**kwargs)

    @st.composite
    def build(draw: st.DrawFn) -> tuple[Item, ...]:
        stream = draw(streams)
        out: list[Item] = [stream[0]] if stream else []
        left = list(choices)
        for request in stream[1:]:
            choice = draw(st.sampled_from(left))
            if choice != "":
                out.append(Restart(choice))
            if choice:  # each change once a stream: a second could change it back
                left.remove(choice)
            out.append(request)
        return tuple(out)

    return build()
