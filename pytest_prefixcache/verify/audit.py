"""The baseline audit: a fresh instance of the engine recomputes a sample of uncached requests.

See :mod:`pytest_prefixcache.checks.baseline` for why. The sample: the first request of each
stream, every request whose images were repeated, replaced, reordered or re-encoded against
an earlier request of the stream (the same image list again, or one of the same length that
differs, or shared images in another order; a next turn that only adds images is not), at
most ``REARRANGED_PER_STREAM`` of them, and every request whose cached and uncached runs
disagree. The cap keeps the default run's cost in bounds (``benchmarks/verify_throughput.py
--audit-cost``); the first request of every stream catches what survives a reset. Each audited
request gets a new engine object, so nothing an earlier request left behind can leak into it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..checks import Comparison, Problem, Tolerance, fault_problems, fresh_problems, fresh_verdict
from ..checks.baseline import CHECK
from ..checks.coverage import APPLIED
from ..output.report import Report
from ..types import Engine, Outcome, Request

__all__ = ["REARRANGED_PER_STREAM", "Audit"]


#: Requests with rearranged images audited per stream (the first ones).
REARRANGED_PER_STREAM = 1


def _rearranged(images: tuple[str, ...], before: tuple[str, ...]) -> bool:
    """Whether ``images`` repeat, replace or reorder the images of an earlier request."""
    if not images:
        return False
    if len(images) == len(before):
        return True  # the same list again (a repeat, a re-encoding) or one that differs
    shared = [d for d in images if d in before]
    return shared != [d for d in before if d in images]  # shared images in another order


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
    _moved: int = 0

    def reset(self) -> None:
        """A new stream begins."""
        self._earlier.clear()
        self._moved = 0

    def _sampled(self, index: int, request: Request) -> bool:
        images = tuple(img.digest for img in request.images)
        moved = self._moved < REARRANGED_PER_STREAM and any(
            _rearranged(images, before) for before in self._earlier
        )
        self._moved += moved
        if images:
            self._earlier.append(images)
        return index == 0 or moved

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
