"""Closed-loop streams at run time: the engine's own replies sent back as assistant turns.

A generated closed-loop stream holds :class:`~pytest_prefixcache.types.ReplyOf` markers
("the reply to request i") where an assistant turn follows request i. Before a request runs,
the verifier replaces each marker with the reply of the cached run of request i, decoded to
text (:attr:`~pytest_prefixcache.types.Outcome.text`); the uncached run gets the same request,
so both sides see exactly the same text, and the stream kept for the failure file and the
replay holds that text, not the marker (a replay is exact, and engine-independent).

An engine that reports no text cannot close the loop: the marker's placeholder text is sent
instead, and the coverage row :data:`CLOSED_LOOP` counts the request under :data:`NO_TEXT`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import RequestError
from ..types import Message, ReplyOf, Request

__all__ = ["CLOSED_LOOP", "NO_TEXT", "fill_replies", "markers"]

#: The coverage row of requests that carry an earlier request's reply.
CLOSED_LOOP = "closed loop"
#: Its reason when an engine's reply had no text (``Outcome.text`` is None).
NO_TEXT = "no text"


def markers(request: Request) -> list[ReplyOf]:
    """The reply markers of ``request``, in order."""
    return [p for m in request.messages for p in m.content if isinstance(p, ReplyOf)]


def fill_replies(request: Request, replies: Sequence[str | None]) -> tuple[Request, int, int]:
    """``request`` with every marker replaced by ``replies[marker.request]`` (the placeholder
    text where that is None), the markers filled with a reply, and those left as placeholders.
    A marker of a request not run yet is an error naming it."""
    found = markers(request)
    if not found:
        return request, 0, 0
    filled = missing = 0
    messages = []
    for m in request.messages:
        parts: list[str | object] = []
        for p in m.content:
            if isinstance(p, ReplyOf):
                if p.request >= len(replies):
                    raise RequestError(
                        f"{p!r}: request {p.request} has not run yet (the stream has run "
                        f"{len(replies)} request(s)); a reply marker names an earlier request"
                    )
                text = replies[p.request]
                if text is None:
                    missing += 1
                    parts.append(str.__str__(p))
                else:
                    filled += 1
                    parts.append(text)
            else:
                parts.append(p)
        messages.append(Message(m.role, tuple(parts)))  # type: ignore[arg-type]
    return Request(tuple(messages), request.namespace, request.max_new_tokens), filled, missing
