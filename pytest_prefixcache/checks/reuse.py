"""The reuse checks: reported reuse against the oracle's maximum (the reuse bound), the
positive control (a cache that is never exercised makes equivalence vacuous), and the opt-in
floor on a stream's cache efficiency (``--prefixcache-min-efficiency``)."""

from __future__ import annotations

from ..types import Outcome, Request
from .oracle import Match
from .problem import Problem

__all__ = [
    "CONTROL_MIN_TOKENS",
    "EFFICIENCY_MIN_TOKENS",
    "control_problems",
    "efficiency_problem",
    "reuse_problems",
]

#: The positive control applies only when the oracle could reuse at least this many tokens
#: (so block-granular caches with blocks up to this size are not flagged).
CONTROL_MIN_TOKENS = 64
#: --prefixcache-min-efficiency applies to a stream only when this many tokens were reusable.
EFFICIENCY_MIN_TOKENS = 64


def reuse_problems(o: Outcome, match: Match | None) -> list[Problem]:
    """``cached_tokens`` may not exceed the oracle's maximum valid reuse."""
    if o.cached_tokens is None or match is None or o.cached_tokens <= match.max_reuse:
        return []
    src = "no earlier request" if match.source is None else f"request {match.source}"
    return [
        Problem(
            "reuse bound",
            f"cached_tokens={o.cached_tokens} exceeds the maximum valid reuse of "
            f"{match.max_reuse} tokens",
            (
                f"longest valid shared prefix: {match.shared} tokens, with {src} of the same "
                "namespace; at least one prompt token must be computed",
            ),
            position=match.max_reuse,
        )
    ]


def control_problems(
    req: Request, prev: Request | None, cached: Outcome, match: Match | None
) -> list[Problem]:
    """The positive control: an identical repeat or an append-only next turn of the previous
    request (same namespace) must reuse something when the oracle says enough was reusable."""
    if prev is None or cached.cached_tokens is None or cached.cached_tokens > 0:
        return []
    if match is None or match.max_reuse < CONTROL_MIN_TOKENS:
        return []
    if prev.namespace != req.namespace or req.messages[: len(prev.messages)] != prev.messages:
        return []
    same = req.messages == prev.messages
    kind = "an identical repeat" if same else "an append-only next turn"
    return [
        Problem(
            "positive control",
            f"{kind} of the previous request reused 0 tokens; {match.max_reuse} were reusable",
            ("the cache never stores, drops every entry, or its key changes between turns",),
        )
    ]


def efficiency_problem(reused: int, reusable: int, floor: float) -> Problem | None:
    """A problem when the stream reused less than ``floor`` of what the oracle allowed
    (judged only when at least ``EFFICIENCY_MIN_TOKENS`` were reusable)."""
    if reusable < EFFICIENCY_MIN_TOKENS:
        return None
    eff = reused / reusable
    if eff >= floor:
        return None
    head = (
        f"the cache reused {reused} of {reusable} reusable tokens ({eff:.1%}), below "
        f"--prefixcache-min-efficiency={floor:g}"
    )
    why = "the cache invalidates more than it must (re-rendered history, coarse keys?)"
    return Problem("min efficiency", head, (why,))
