"""The baseline audit: a fresh instance of the engine recomputes a sample of uncached requests.

See :mod:`pytest_prefixcache.checks.baseline` for why. The sample, where bugs hide first:

- the first request of each stream (what survives a reset);
- every request whose images come back in another order than in an earlier request of the
  stream (the same images in another order, or shared images reordered): a feature cache
  keyed by the set of images, not their order, shows only there;
- the first ``REPLACED_PER_STREAM`` requests whose image list replaces images of an earlier
  one (the same length, other images);
- the first ``REPEATED_PER_STREAM`` requests that repeat an earlier image list exactly (a
  repeat or a re-encoding): its own budget, so a plain repeat never uses up the sample of
  the reorders and replacements that follow it;
- every request whose cached and uncached runs disagree.

A next turn that only adds images is not sampled. The caps keep the default run's cost in
bounds (``benchmarks/verify_throughput.py --audit-cost``). The coverage row counts audited
requests against all of them: the others are "not in the audit's sample", which is not a gap.
Each audited request gets a new engine object, so nothing an earlier request left behind can
leak into it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..checks import Comparison, Problem, Tolerance, fault_problems, fresh_problems, fresh_verdict
from ..checks.baseline import CHECK
from ..checks.coverage import APPLIED, NOT_SAMPLED
from ..output.report import Report
from ..types import Engine, Outcome, Request

__all__ = ["REPEATED_PER_STREAM", "REPLACED_PER_STREAM", "Audit", "rearrangement"]


#: Requests that replace an earlier request's images audited per stream (the first ones).
REPLACED_PER_STREAM = 2
#: Requests that repeat an earlier request's image list exactly, audited per stream.
REPEATED_PER_STREAM = 1


def rearrangement(images: tuple[str, ...], before: tuple[str, ...]) -> str | None:
    """How ``images`` rearrange the images of an earlier request: ``"reordered"`` (shared
    images in another order), ``"replaced"`` (as many images, other ones), ``"repeated"``
    (the same list again), or None (no images, or only images added)."""
    if not images:
        return None
    shared = [d for d in images if d in before]
    if shared != [d for d in before if d in images]:
        return "reordered"
    if images == before:
        return "repeated"
    if len(images) == len(before):
        return "replaced"
    return None


Call = Callable[[str, Callable[[], object]], object]
"""Runs an engine call on the verifier's worker under its timeout: (what, fn) -> result."""


@dataclass
class Audit:
    """Which requests a fresh instance recomputes, and how."""

    fresh: Callable[[], Engine] | None = None
    """Builds a fresh instance of the engine (None: the baseline cannot be audited)."""
    missing: str = "engine given as an instance"
    """Why there is no ``fresh`` (the coverage table shows it)."""
    _earlier: list[tuple[str, ...]] = field(default_factory=list)
    _spent: dict[str, int] = field(default_factory=dict)

    def reset(self) -> None:
        """A new stream begins."""
        self._earlier.clear()
        self._spent.clear()

    def _sampled(self, index: int, request: Request) -> bool:
        images = tuple(img.digest for img in request.images)
        kinds = {rearrangement(images, before) for before in self._earlier}
        if images:
            self._earlier.append(images)
        if index == 0 or "reordered" in kinds:
            return True
        caps = (("replaced", REPLACED_PER_STREAM), ("repeated", REPEATED_PER_STREAM))
        for kind, cap in caps:
            if kind in kinds and self._spent.get(kind, 0) < cap:
                self._spent[kind] = self._spent.get(kind, 0) + 1
                return True
        return False

    def check(
        self,
        index: int,
        request: Request,
        cached: Outcome,
        uncached: Outcome,
        comparison: Comparison,
        *,
        tol: Tolerance,
        call: Call,
        report: Report,
    ) -> list[Problem]:
        """Audit the request if it is in the sample; the problems of the fresh run, or of the
        baseline against it. An equivalence problem gets a line saying which side the fresh
        instance agrees with."""
        sampled = self._sampled(index, request)
        if self.fresh is None:
            report.count(CHECK, self.missing)
            return []
        if not (sampled or comparison.problems):
            report.count(CHECK, NOT_SAMPLED)
            return []
        engine = call("building a fresh instance of the engine", self.fresh)
        run = engine.run  # type: ignore[attr-defined]
        try:
            fresh = call(
                f"a fresh instance's run(request {index}, use_cache=False)",
                lambda: run(request, use_cache=False),
            )
        finally:  # a fresh server, say, is stopped as soon as it has answered
            close = getattr(engine, "close", None)
            if callable(close):
                close()
        faults = fault_problems(fresh, request)
        if faults:
            return [replace(p, headline="fresh instance: " + p.headline) for p in faults]
        assert isinstance(fresh, Outcome)
        report.count(CHECK, APPLIED)
        problems = fresh_problems(cached, uncached, fresh, tol)
        if comparison.problems and not problems:
            first = comparison.problems[0]
            line = fresh_verdict(cached, fresh, tol)
            comparison.problems[0] = replace(first, details=(*first.details, line))
        return problems
