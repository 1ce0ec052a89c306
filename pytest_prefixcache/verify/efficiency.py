"""The efficiency tier of one stream: what its cache saved against what it could have saved.

A correct cache can still save less than it should. Across one stream's requests the verifier
keeps the figures that judge it (:class:`StreamEfficiency`): the seconds its cache hits took
warm and cold (``--prefixcache-min-speedup``), the tokens reused against what the declared
reference allowed (``--prefixcache-min-efficiency``), and the previous request's footprint
(what the positive control needs to know whether the engine's declared capacity could have
kept it). Problems of the checks in :data:`FINDINGS` are efficiency findings: recorded in the
report, not failed (:func:`triage`; render hygiene fails with ``strict_render``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import (
    CAPACITY,
    HYGIENE,
    NO_SNAPSHOT,
    OLDER_ENTRY,
    UNDER_ONE_BLOCK,
    Match,
    Problem,
    control_problems,
)
from ..output.report import Report
from ..output.reuse import add_reuse
from ..types import Outcome, Request

__all__ = ["FINDINGS", "StreamEfficiency", "triage"]

#: Checks whose problems are efficiency findings: recorded, not failed (render hygiene fails
#: with ``strict_render``).
FINDINGS = frozenset({CAPACITY, HYGIENE, NO_SNAPSHOT, OLDER_ENTRY, UNDER_ONE_BLOCK})


def triage(
    problems: list[Problem], index: int, report: Report, *, strict_render: bool
) -> list[Problem]:
    """The problems that fail: those of :data:`FINDINGS` are recorded in ``report`` instead
    (render hygiene fails with ``strict_render``)."""
    fail = []
    for p in problems:
        if p.check in FINDINGS and not (p.check == HYGIENE and strict_render):
            report.add_finding(p.check, f"request {index}: {p.headline}")
        else:
            fail.append(p)
    return fail


@dataclass
class StreamEfficiency:
    """What one stream's cache saved so far; :meth:`reset` with the stream."""

    warm: float = 0.0
    """Seconds the cached runs of cache hits took."""
    cold: float = 0.0
    """Seconds the uncached runs of the same requests took."""
    reused: int = 0
    """Tokens reused, each request's capped at what the declared reference allowed."""
    reusable: int = 0
    """Tokens the declared reference allowed."""
    footprint: int = 0
    """The previous request's prompt and output tokens (what each of its runs stored)."""

    def reset(self) -> None:
        self.warm = self.cold = 0.0
        self.reused = self.reusable = self.footprint = 0

    def add_times(
        self, report: Report, cached: Outcome, warm: float, cold: float, skewed: object
    ) -> None:
        """Count a cache hit's seconds, unless the engine says its uncached times are
        ``skewed`` (e.g. a server restarted for every uncached run): then no speedup is
        computed, nor shown anywhere."""
        if skewed:
            report.speedup_not_measured = str(skewed)
            report.warm_seconds = report.cold_seconds = 0.0
        elif cached.cached_tokens:
            self.warm += warm
            self.cold += cold
            report.warm_seconds += warm
            report.cold_seconds += cold

    def add_reuse(self, report: Report, cached: Outcome, match: Match | None) -> None:
        """Count what the cached run reused against what each reference allowed."""
        if match is not None and cached.cached_tokens is not None:
            add_reuse(report, cached.cached_tokens, match)
            self.reused += min(cached.cached_tokens, match.allowed)
            self.reusable += match.allowed

    def control(
        self,
        request: Request,
        prev: Request | None,
        cached: Outcome,
        match: Match | None,
        capacity: int | None,
    ) -> list[Problem]:
        """The positive control, with the engine's ``cache_capacity_tokens`` (None: not
        declared) and the previous request's footprint; this request's becomes the next's."""
        footprint, self.footprint = self.footprint, (cached.prompt_tokens or 0) + len(cached.tokens)
        return control_problems(
            request, prev, cached, match, capacity=capacity, footprint=footprint
        )
