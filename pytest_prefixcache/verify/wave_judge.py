"""How a wave's replies are judged: a batching fault or a cache fault, and what was compared.

Each request of a wave runs three times: cached in the wave, cold alone, cold in the wave (the
noise control, ``use_cache=False`` calls in flight together). The cold wave against the same
requests alone isolates batching from caching:

- the cold wave answers as the requests alone, and a cached reply differs: a cache fault,
  ``cache: only the cached wave differs``; unless the engine serves a wave's uncached runs
  one at a time (its ``cold_waves_serial`` says why: a reset before each), when the cold wave
  was no batch and the failure reads :data:`UNSEPARATED` (a batching fault is not ruled out);
- the cold wave already differs from the requests alone, on an engine that declares
  ``batch_invariant = True`` (its replies do not depend on the requests in flight with them,
  as the reference engine's by construction): a batching fault, whatever the cache does,
  ``batching: the cold wave already differs from the requests alone``;
- the cold wave differs on any other engine: batch non-invariance (a batch's numerics), the
  finding :data:`BATCH_NOISE`; the cached replies of that wave are then judged within
  :data:`NOISE_FACTOR` times the measured noise, and one beyond it reads ``cache: the cached
  wave differs beyond the cold wave's batch noise``.

Every step is compared, the first token's logits and each decode step's after it (full
vocabulary where the engine gives logits, its top logprobs where only those exist); the
coverage rows :data:`DECODE_STEPS` (decode steps compared / generated, over the cached
replies) and :data:`DECODING` (wave requests that generated more than one token) say how much
of the waves' decoding was looked at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..checks import Problem, compare
from ..checks.coverage import APPLIED
from ..checks.equivalence import Comparison, Tolerance
from ..traits import traits_of
from ..types import Outcome

__all__ = [
    "BATCHING",
    "BATCH_NOISE",
    "CACHE_BEYOND_NOISE",
    "CACHE_ONLY",
    "DECODE_STEPS",
    "DECODING",
    "NOISE_FACTOR",
    "UNSEPARATED",
    "Noise",
    "batch_invariant",
    "batching_problems",
    "decode_coverage",
    "judge",
    "measure_noise",
]

#: The finding of a cache-off wave whose replies differ from the same requests alone.
BATCH_NOISE = "batch non-invariance"
#: Under measured batch noise, a cached reply passes within this many times the noise.
NOISE_FACTOR = 4.0
BATCHING = "batching: the cold wave already differs from the requests alone"
CACHE_ONLY = "cache: only the cached wave differs"
CACHE_BEYOND_NOISE = "cache: the cached wave differs beyond the cold wave's batch noise"
UNSEPARATED = (
    "cache or batching: the cached wave differs, and the cold wave was served one at a time"
)
#: The coverage row of the waves' decode steps (a step, not a request, per count).
DECODE_STEPS = "wave decode steps"
#: The coverage row of the wave requests that generated more than one token.
DECODING = "wave requests that decode"
ONE_TOKEN = "one token or none"
NO_STEPS = "no step logits"
DIVERGED = "after the greedy tokens diverged"


def batch_invariant(engine: object) -> bool:
    """Whether the engine declares ``batch_invariant = True``: a reply in a batch equals the
    same request alone, so a cold wave that differs is a batching fault, not noise."""
    return traits_of(engine).batch_invariant is True


@dataclass(frozen=True)
class Noise:
    """The cold wave against the same requests alone: per request, the largest difference
    beyond the tolerance (0.0: the same reply; inf: different tokens, no logits to measure)."""

    per_request: tuple[float, ...]
    comparisons: tuple[Comparison, ...]

    @property
    def worst(self) -> float:
        return max(self.per_request, default=0.0)


def measure_noise(tol: Tolerance, alone: Sequence[Outcome], cold: Sequence[Outcome]) -> Noise:
    """Each cold reply in the wave compared with the same request alone."""
    comparisons = tuple(compare(n, a, tol) for a, n in zip(alone, cold))
    per = tuple(
        (c.worst_diff if c.worst_diff > 0 else float("inf")) if c.problems else 0.0
        for c in comparisons
    )
    return Noise(per, comparisons)


def batching_problems(noise: Noise) -> tuple[int, list[Problem]] | None:
    """The first request whose cold reply in the wave differs from the same request alone,
    and its comparison's problems told as a batching fault (None: the cold wave is clean)."""
    for i, (diff, comparison) in enumerate(zip(noise.per_request, noise.comparisons)):
        if diff:
            said = [
                Problem(p.check, f"{BATCHING} (cold in the wave vs cold alone): {p.headline}",
                        p.details, p.position)
                for p in comparison.problems
            ]  # fmt: skip
            return i, said
    return None


def judge(
    tol: Tolerance, noise: Noise, i: int, cached: Outcome, alone: Outcome, serial: str = ""
) -> tuple[Comparison, list[Problem]]:
    """Request ``i``'s cached reply against its cold run alone, its problems told as a cache
    fault; under batch noise (an engine that does not declare batch invariance), within
    :data:`NOISE_FACTOR` times the noise measured. ``serial``: why the cold wave was served
    one at a time (the engine's ``cold_waves_serial``): then it is told :data:`UNSEPARATED`."""
    comparison = compare(cached, alone, tol)
    if not comparison.problems:
        return comparison, []
    worst = noise.worst
    if serial and not worst:
        why = (
            f"{serial}: the cold wave was no batch, so it does not tell a batching fault "
            "from a cache fault; replay the wave against a server without the cache to tell"
        )
        return comparison, _told(comparison.problems, UNSEPARATED, (why,))
    if worst == 0.0 or tol.kl is not None or worst == float("inf"):
        cause = CACHE_ONLY if not noise.per_request[i] else CACHE_BEYOND_NOISE
        return comparison, _told(comparison.problems, cause, ())
    wide = Tolerance(atol=max(tol.atol, NOISE_FACTOR * worst), rtol=tol.rtol)
    again = compare(cached, alone, wide)
    if not again.problems:
        return again, []
    note = (
        f"the cache-off wave differs from the same requests alone by up to {worst:.3g} "
        f"(batch non-invariance); cached replies judged within atol={wide.atol:.3g}"
    )
    cause = CACHE_ONLY if not noise.per_request[i] else CACHE_BEYOND_NOISE
    return comparison, _told(comparison.problems, cause, (note,))


def _told(problems: list[Problem], cause: str, notes: tuple[str, ...]) -> list[Problem]:
    return [
        Problem(p.check, f"{cause}: {p.headline}", (*p.details, *notes), p.position)
        for p in problems
    ]


def decode_coverage(
    cached: Outcome, alone: Outcome, comparison: Comparison
) -> list[tuple[str, str, int]]:
    """(row, outcome, count) of one wave request: whether it decoded, and its decode steps
    (every token after the first) compared with the cold run alone, or why not."""
    generated = max(0, len(cached.tokens) - 1)
    rows = [(DECODING, APPLIED if generated else ONE_TOKEN, 1)]
    if not generated:
        return rows
    compared = min(comparison.decode_steps, generated)
    rows.append((DECODE_STEPS, APPLIED, compared))
    if compared < generated:
        has = [bool(o.step_logits or o.step_top_logprobs) for o in (cached, alone)]
        why = DIVERGED if all(has) and cached.tokens != alone.tokens else NO_STEPS
        rows.append((DECODE_STEPS, why, generated - compared))
    return rows
