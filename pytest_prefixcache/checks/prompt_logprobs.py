"""Prompt logprobs: what an engine says about the prompt's own positions on a cache hit.

An engine that returns prompt logprobs (vLLM's ``prompt_logprobs`` request field) says, for
each prompt position, the distribution the model computed there. On a cache hit the positions
it reused were not computed by this request: their values must still be the cold run's (an
engine that serves them from a store keyed without the full prefix, or that recomputes them
over the reused KV wrongly, gives other values). The check compares every position both runs
report, under the request's tolerance (its atol and rtol; the KL rule's top-k comparison does
not apply to a prompt position), and names whether the first bad position was a reused one.

The coverage row :data:`PROMPT_LOGPROBS` is shown where either run returned prompt logprobs or
the engine declares ``returns_prompt_logprobs``; a request with no reused position says so
(:data:`NO_REUSED_POSITION`: the values compared were all computed, not a gap). vLLM 0.32
reads no cache for a request that asks for prompt logprobs, so on vLLM every request lands
there (engines/vllm/NOTES.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from ..types import Outcome
from .equivalence import Tolerance
from .problem import Problem

__all__ = [
    "NO_PROMPT_LOGPROBS",
    "NO_REUSED_POSITION",
    "PROMPT_LOGPROBS",
    "prompt_logprob_coverage",
    "prompt_logprob_problems",
]

#: The coverage row and the check's name.
PROMPT_LOGPROBS = "prompt logprobs"
#: The row's reason when a run returned none (a gap where the engine declared them).
NO_PROMPT_LOGPROBS = "no prompt_logprobs in the reply"
#: The row's reason when the cached run reused no position (nothing cached to compare).
NO_REUSED_POSITION = "no reused position (cached_tokens 0)"

Positions = Sequence[Mapping[int, float] | None]


def prompt_logprob_coverage(
    cached: Outcome, uncached: Outcome, *, declared: bool = False
) -> Iterator[tuple[str, str]]:
    """The row for this request: ``applied`` when reused positions were compared, otherwise
    why not; nothing when neither run reported prompt logprobs and the engine declares none."""
    have = [o.prompt_logprobs is not None for o in (cached, uncached)]
    if not any(have) and not declared:
        return
    if not all(have):
        yield PROMPT_LOGPROBS, NO_PROMPT_LOGPROBS
    elif not cached.cached_tokens:
        yield PROMPT_LOGPROBS, NO_REUSED_POSITION
    else:
        yield PROMPT_LOGPROBS, "applied"


def prompt_logprob_problems(cached: Outcome, uncached: Outcome, tol: Tolerance) -> list[Problem]:
    """The cached run's prompt logprobs against the cold run's, position by position, on the
    token ids both name: one problem naming the first and the worst difference."""
    c, u = cached.prompt_logprobs, uncached.prompt_logprobs
    if c is None or u is None:
        return []
    reused = cached.cached_tokens or 0
    bad: list[tuple[int, int, float, float]] = []
    lengths = f"{len(c)} positions cached vs {len(u)} uncached"
    for pos, (a, b) in enumerate(zip(c, u, strict=False)):
        if a is None or b is None:
            continue
        for tid in sorted(set(a) & set(b)):
            if abs(a[tid] - b[tid]) > tol.atol + tol.rtol * abs(b[tid]):
                bad.append((pos, tid, a[tid], b[tid]))
    if not bad and len(c) == len(u):
        return []
    if not bad:
        where = min(len(c), len(u))
        return [Problem(PROMPT_LOGPROBS, f"prompt logprobs: {lengths}", position=where)]
    worst = max(bad, key=lambda b: abs(b[2] - b[3]))
    first = bad[0]
    in_reuse = sum(1 for b in bad if b[0] < reused)
    return [
        Problem(
            PROMPT_LOGPROBS,
            f"differ at position {first[0]}"
            f" ({'reused' if first[0] < reused else 'computed'}: cached_tokens={reused}):"
            f" token id {first[1]}: cached {first[2]:.9g} vs uncached {first[3]:.9g}",
            (
                f"{len(bad)} value(s) differ beyond {tol.describe()}, {in_reuse} of them at "
                f"reused positions (below {reused}); {lengths}",
                f"worst: position {worst[0]}, token id {worst[1]}: cached {worst[2]:.9g} vs "
                f"uncached {worst[3]:.9g} (|diff| {abs(worst[2] - worst[3]):.3g})",
                "a reused position's prompt logprobs must be what the cold run computes there",
            ),
            position=first[0],
        )
    ]
