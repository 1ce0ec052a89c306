"""The baseline audit: a fresh instance of the engine recomputes a sample of uncached requests.

See :mod:`pytest_prefixcache.checks.baseline` for why. The sample: the first request of each
stream, every image request after the stream's first images (a repeated, replaced, reordered
or re-encoded image), and every request whose cached and uncached runs disagree. Each audited
request gets a new engine object, so nothing an earlier request left behind can leak into it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..checks import Comparison, Problem, Tolerance, fault_problems, fresh_problems, fresh_verdict
from ..checks.baseline import CHECK
from ..checks.coverage import APPLIED
from ..output.report import Report
from ..types import Engine, Outcome, Request

__all__ = ["Audit"]

Call = Callable[[str, Callable[[], object]], object]
"""Runs an engine call on the verifier's worker under its timeout: (what, fn) -> result."""


@dataclass
class Audit:
    """Which requests a fresh instance recomputes, and how."""

    fresh: Callable[[], Engine] | None = None
    """Builds a fresh instance of the engine (None: the baseline cannot be audited)."""
    missing: str = "engine given as an instance"
    """Why there is no ``fresh`` (the coverage table shows it)."""
    _images_seen: bool = False

    def reset(self) -> None:
        """A new stream begins."""
        self._images_seen = False

    def _sampled(self, index: int, request: Request) -> bool:
        sampled = index == 0 or (bool(request.images) and self._images_seen)
        self._images_seen = self._images_seen or bool(request.images)
        return sampled

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
        fresh = call(
            f"a fresh instance's run(request {index}, use_cache=False)",
            lambda: run(request, use_cache=False),
        )
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
