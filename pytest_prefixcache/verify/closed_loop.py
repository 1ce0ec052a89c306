"""Closed-loop streams at run time: the engine's own replies sent back as assistant turns.

A generated closed-loop stream holds :class:`~pytest_prefixcache.types.ReplyOf` markers
("the reply to request i") where an assistant turn follows request i. Before a request runs,
the verifier replaces each marker with the reply of the cached run of request i, decoded to
text (:attr:`~pytest_prefixcache.types.Outcome.text`); the uncached run gets the same request,
so both sides see exactly the same text, and the stream kept for the failure file and the
replay holds that text, not the marker (a replay is exact, and engine-independent).

An engine that reports no text cannot close the loop: the marker's placeholder text is sent
instead, and the coverage row :data:`CLOSED_LOOP` counts the request under :data:`NO_TEXT`.

The decode rule: on some families a one-token decode step and a prefill of the same position
are not bit-exact, so a correct cache that reused KV its decode computed differs from a cold
run. An engine declares ``decode_atol`` (measured: ``adapters/tolerances.py``); it applies ONLY
to a request whose cached run reused past ``Match.decode_start`` (:func:`tolerance_for`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..checks import Match, Tolerance
from ..errors import RequestError
from ..traits import traits_of
from ..types import Message, Outcome, ReplyOf, Request

__all__ = [
    "CLOSED_LOOP",
    "NO_TEXT",
    "decode_atol_of",
    "fill_replies",
    "judged_line",
    "markers",
    "rule_name",
    "tolerance_for",
]

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
    filled_in = Request(tuple(messages), request.namespace, request.max_new_tokens, request.adapter)
    return filled_in, filled, missing


def decode_atol_of(engine: object, override: float | None = None) -> float:
    """The decode rule's atol: ``override`` (``VerifyOptions.decode_atol``), else the engine's
    own ``decode_atol``; 0.0 (exact, as every other request) when neither is above 0."""
    atol = traits_of(engine).decode_atol if override is None else override
    if isinstance(atol, bool) or not isinstance(atol, (int, float)) or atol <= 0:
        return 0.0
    return float(atol)


def tolerance_for(tol: Tolerance, atol: float, cached: Outcome, match: Match | None) -> Tolerance:
    """The decode rule (``tol`` with atol raised to ``atol``) when the cached run reused past
    ``match.decode_start``, positions whose KV an earlier decode computed; ``tol`` itself
    otherwise (also under a KL rule, or when ``tol`` already allows as much)."""
    if (
        not atol
        or tol.kl is not None
        or atol <= tol.atol
        or match is None
        or match.decode_start is None
        or (cached.cached_tokens or 0) <= match.decode_start
    ):
        return tol
    return Tolerance(atol, tol.rtol, None)


def rule_name(engine: object) -> str:
    """How the report names the engine's decode rule."""
    return str(traits_of(engine).decode_rule or "the engine's decode_atol")


def judged_line(engine: object, atol: float, match: Match | None) -> str:
    """The failure's line naming the decode rule it was judged by."""
    start = None if match is None else match.decode_start
    return (
        f"judged by the decode rule (atol {atol:g}: {rule_name(engine)}): the cached run "
        f"reused positions from {start} on, whose KV an earlier request's decode computed"
    )
