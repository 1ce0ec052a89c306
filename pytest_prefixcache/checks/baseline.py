"""The cold baseline: the uncached run is an engine state too, so it is verified, not trusted.

``use_cache=False`` must compute from scratch. An engine can keep other caches (pixel values,
vision embeddings, processor outputs) that a prefix-cache switch or a reset does not clear;
then the "uncached" answer shares the cached run's mistake, cached == uncached, and a gate
passes an engine that answers about the wrong image. Two checks:

- an uncached run may not report reuse (``cached_tokens > 0``): a fault;
- a fresh instance (a new engine object) recomputes a sample of uncached requests (the first
  of each stream, every image request after the stream's first images, every request whose
  cached and uncached runs disagree); a fresh result that differs from the baseline fails
  "cold baseline" with cached, uncached and fresh values. Every equivalence failure says
  which side the fresh instance agrees with.
"""

from __future__ import annotations

from ..types import Outcome
from .equivalence import Tolerance, compare
from .problem import Problem

__all__ = ["CHECK", "baseline_problems", "fresh_problems", "fresh_verdict"]

CHECK = "cold baseline"


def baseline_problems(uncached: Outcome) -> list[Problem]:
    """The uncached run must compute from scratch: it may not report reuse."""
    if not uncached.cached_tokens:
        return []
    return [
        Problem(
            "fault",
            f"use_cache=False reported cached_tokens={uncached.cached_tokens}: the uncached "
            "baseline must compute every prompt token, or cached == uncached proves nothing",
        )
    ]


def _first(fresh: Outcome, other: Outcome, tol: Tolerance) -> str | None:
    """How ``other`` differs from the fresh instance's outcome, or None when it agrees."""
    c = compare(other, fresh, tol)
    if not c.problems:
        return None
    if c.first_bad is not None:
        d = c.first_bad
        return (
            f"step {d.step}, token id {d.index}: {d.cached:.9g} vs fresh {d.uncached:.9g} "
            f"(|diff| {d.diff:.3g})"
        )
    # compare() names its sides "cached" and "uncached": here they are this run and the fresh one
    return c.problems[0].headline.replace("uncached", "fresh").replace("cached", "this run")


def fresh_problems(
    cached: Outcome, uncached: Outcome, fresh: Outcome, tol: Tolerance
) -> list[Problem]:
    """A problem when a fresh instance's uncached run differs from the baseline's."""
    base = _first(fresh, uncached, tol)
    if base is None:
        return []
    hit = _first(fresh, cached, tol)
    side = (
        "the fresh instance agrees with the cached run"
        if hit is None
        else f"the cached run differs from the fresh instance too: {hit}"
    )
    return [
        Problem(
            CHECK,
            "the uncached baseline is not cold: a fresh instance of the engine computes "
            "another answer for the same request",
            (
                f"uncached: {base}",
                side,
                "the engine keeps state that use_cache=False and reset() do not clear (pixel "
                "values, vision embeddings, processor outputs?): its uncached runs cannot "
                "serve as the baseline",
            ),
        )
    ]


def fresh_verdict(cached: Outcome, fresh: Outcome, tol: Tolerance) -> str:
    """The line an equivalence failure carries once a fresh instance agreed with the baseline."""
    if _first(fresh, cached, tol) is None:
        return "a fresh instance agrees with the cached run (and not with the uncached one)"
    return "a fresh instance agrees with the uncached run: the cached run is wrong"
