"""The reuse checks: reported reuse against the token oracle's maximum (the reuse bound), the
positive control (a cache that is never exercised makes equivalence vacuous), and the opt-in
floor on a stream's cache efficiency (``--prefixcache-min-efficiency``).

The reuse bound is the token oracle's for every design. The positive control and the
efficiency floor judge the reference the engine declares (:mod:`.references`): a cache that
resumes only at snapshots, or keeps whole blocks only, is not a cache that never stores. When
the token oracle would have fired the control but the declared reference does not, the
control reports why as a finding (:data:`NO_SNAPSHOT`, :data:`UNDER_ONE_BLOCK`), not a
failure. The control's premise is the previous request: what only an older request left may
have been evicted since (a cache of bounded capacity, vLLM's on a small KV budget), and a
repeat that misses it is the finding :data:`OLDER_ENTRY`. An engine whose cache holds at most
``cache_capacity_tokens``, shared with its uncached runs (vLLM's salted baseline on one
server), may have evicted even the previous request's prefix to serve that request's uncached
run: when the two runs needed more than the capacity, a miss is the finding :data:`CAPACITY`.
"""

from __future__ import annotations

from ..types import Outcome, Request
from .oracle import Match, source_name
from .problem import Problem
from .references import CacheDesign

__all__ = [
    "CAPACITY",
    "CONTROL_MIN_TOKENS",
    "EFFICIENCY_MIN_TOKENS",
    "NO_SNAPSHOT",
    "OLDER_ENTRY",
    "UNDER_ONE_BLOCK",
    "control_problems",
    "efficiency_problem",
    "reuse_problems",
]

#: The positive control applies only when the declared reference could reuse at least this
#: many tokens (so block-granular caches with blocks up to this size are not flagged).
CONTROL_MIN_TOKENS = 64
#: --prefixcache-min-efficiency applies to a stream only when this many tokens were reusable.
EFFICIENCY_MIN_TOKENS = 64
#: The efficiency-tier finding of a snapshot cache that had no snapshot to resume from.
NO_SNAPSHOT = "snapshot boundary"
#: The finding of a block-granular cache whose reusable prefix held too few whole blocks.
UNDER_ONE_BLOCK = "block granularity"
#: The finding of a control whose reusable prefix only an older request than the previous one
#: left (evictable by a bounded cache since).
OLDER_ENTRY = "older entry"
#: The finding of a control whose previous request's cached and uncached runs needed more than
#: the cache holds (the uncached run, on the same cache, may have evicted the prefix).
CAPACITY = "cache capacity"

NOTHING_STORED = (
    "nothing stored: the cache never stores, drops every entry, or its key changes between turns"
)


def reuse_problems(o: Outcome, match: Match | None) -> list[Problem]:
    """``cached_tokens`` may not exceed the correctness bound (:meth:`.Match.exceeded_by`, the
    test the report's over-claim count uses too)."""
    if match is None or not match.exceeded_by(o.cached_tokens):
        return []
    src = "no earlier request" if match.source is None else source_name(match.source)
    outputs = (
        f" (through an earlier request's output tokens: {match.limit})"
        if match.limit > match.max_reuse
        else ""
    )
    return [
        Problem(
            "reuse bound",
            f"cached_tokens={o.cached_tokens} exceeds the maximum valid reuse of "
            f"{match.limit} tokens",
            (
                f"longest valid shared prefix: {match.shared} tokens, with {src} of the same "
                f"namespace{outputs}; at least one prompt token must be computed",
                "judged against the token oracle, whatever the engine's declared design: no "
                "cache can validly reuse more",
            ),
            position=match.limit,
        )
    ]


def control_problems(
    req: Request,
    prev: Request | None,
    cached: Outcome,
    match: Match | None,
    *,
    capacity: int | None = None,
    footprint: int = 0,
) -> list[Problem]:
    """The positive control: an identical repeat or an append-only next turn of the previous
    request (same namespace) must reuse something when the declared reference says enough
    was reusable. When only the token oracle says so, a finding names the design's reason.
    ``capacity``: the tokens the engine's cache holds, its uncached runs' included (None:
    unbounded); ``footprint``: the previous request's prompt and output tokens, which its
    cached and its uncached run each stored."""
    if prev is None or cached.cached_tokens is None or cached.cached_tokens > 0:
        return []
    if match is None or match.max_reuse < CONTROL_MIN_TOKENS:
        return []
    if prev.scope != req.scope or req.messages[: len(prev.messages)] != prev.messages:
        return []
    same = req.messages == prev.messages
    kind = "an identical repeat" if same else "an append-only next turn"
    head = f"{kind} of the previous request reused 0 tokens"
    design = match.design
    recent = match.allowed if match.recent is None else match.recent
    if match.allowed >= CONTROL_MIN_TOKENS and recent < CONTROL_MIN_TOKENS:
        return [
            Problem(
                OLDER_ENTRY,
                f"{head}; {design.label} says {match.allowed} were reusable, but from request "
                f"{match.source}: the previous request leaves only {recent}",
                (
                    "a cache of bounded capacity may have evicted an older request's entries "
                    "since (the cold runs of a salted baseline share it too): not a failure",
                    match.references(),
                ),
            )
        ]
    if match.allowed >= CONTROL_MIN_TOKENS and capacity is not None and 2 * footprint > capacity:
        return [
            Problem(
                CAPACITY,
                f"{head}; {design.label} says {match.allowed} were reusable, but the previous "
                f"request's cached and uncached runs stored {2 * footprint} tokens in a cache "
                f"that holds {capacity}",
                (
                    "its uncached run shares the cache and may have evicted the prefix: not a "
                    "failure (a larger cache would keep it)",
                    match.references(),
                ),
            )
        ]
    if match.allowed >= CONTROL_MIN_TOKENS:
        details = [NOTHING_STORED, match.references()]
        if design.reference == "token" and (match.snapshot or 0) < CONTROL_MIN_TOKENS:
            details.append(
                "a cache that resumes only at snapshots (recurrent or sliding-window layers) "
                f"could reuse {match.snapshot or 0} here: if yours does, declare "
                "reuse_reference = 'snapshot'"
            )
        return [
            Problem(
                "positive control",
                f"{head}; {design.label} says {match.allowed} were reusable",
                tuple(details),
            )
        ]
    return [_design_finding(head, match, design)]


def _design_finding(head: str, match: Match, design: CacheDesign) -> Problem:
    """Why the declared reference allowed less than the control needs, as a finding."""
    token = f"{head}; the token oracle says {match.max_reuse} were reusable"
    short = f"(< {CONTROL_MIN_TOKENS})"
    if design.reference == "block":
        size = design.block_size
        why = (
            f"but the shared prefix is shorter than one block ({size} tokens)"
            if not match.block
            else f"but its whole blocks of {size} tokens hold only {match.block} {short}"
        )
        return Problem(
            UNDER_ONE_BLOCK,
            f"{token}, {why}",
            ("a block-granular cache reuses whole blocks only: not a failure", match.references()),
        )
    src = match.boundary_source
    earlier = "an earlier prompt" if src is None else f"request {src}"
    return Problem(
        NO_SNAPSHOT,
        f"{token}, but the longest boundary of {earlier} within the shared prefix is "
        f"{match.snapshot or 0} {short}: no snapshot at that boundary",
        (
            "a snapshot cache resumes only where it passed a boundary while prefilling an "
            "earlier prompt (a message start, an image edge, the prompt's end): not a failure; "
            "snapshots at more positions would reuse more",
            match.references(),
        ),
    )


def efficiency_problem(
    reused: int, reusable: int, floor: float, design: CacheDesign | None = None
) -> Problem | None:
    """A problem when the stream reused less than ``floor`` of what the declared reference
    allowed (judged only when at least ``EFFICIENCY_MIN_TOKENS`` were reusable)."""
    if reusable < EFFICIENCY_MIN_TOKENS:
        return None
    eff = reused / reusable
    if eff >= floor:
        return None
    design = design or CacheDesign()
    head = (
        f"the cache reused {reused} of {reusable} reusable tokens ({eff:.1%}), below "
        f"--prefixcache-min-efficiency={floor:g}"
    )
    judged = f"reusable according to {design.label}, the engine's declared design"
    why = "the cache invalidates more than it must (re-rendered history, coarse keys?)"
    if design.reference == "snapshot":
        why = (
            "the cache resumes before boundaries it passed (too few snapshots, re-rendered "
            "history?)"
        )
    return Problem("min efficiency", head, (why, judged))
