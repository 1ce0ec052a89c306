"""Progress lines for long runs: requests done, cache hits, failures so far."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..output.report import Report

__all__ = ["Progress", "counts"]


def counts(report: Report) -> dict[str, int]:
    return {
        "requests": report.requests,
        "hits": report.cache_hits,
        "streams": report.streams,
        "failures": len(report.failures),
    }


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """Writes at most one line every ``every`` seconds through ``write`` (0: never)."""

    def __init__(self, every: float, write: Callable[[str], None]) -> None:
        self.every = every
        self.write = write
        self.start = time.monotonic()
        self.last = self.start

    def due(self) -> bool:
        return self.every > 0 and time.monotonic() - self.last >= self.every

    def show(self, c: dict[str, int], *, failing: int = 0, workers: int = 0) -> None:
        if not self.due():
            return
        self.last = time.monotonic()
        where = f" on {workers} worker(s)" if workers else ""
        line = (
            f"prefixcache: {c.get('requests', 0)} requests ({c.get('hits', 0)} with cache hits) "
            f"in {c.get('streams', 0)} streams{where}, {c.get('failures', 0)} failed test(s)"
        )
        if failing:
            line += f", shrinking: {failing} failing example(s) so far"
        self.write(f"{line}; {_clock(self.last - self.start)}")

    def on_step(self, report: Report, failing: int) -> None:
        """Called by the verifier before each request."""
        if self.due():
            self.show(counts(report), failing=failing)
