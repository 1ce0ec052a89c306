"""The efficiency tier of one stream: what its cache saved against what it could have saved.

A correct cache can still save less than it should. Across one stream's requests the verifier
keeps the figures that judge it (:class:`StreamEfficiency`): the seconds its cache hits took
warm and cold (``--prefixcache-min-speedup``), the tokens reused against what the declared
reference allowed (``--prefixcache-min-efficiency``), and the previous request's footprint
(what the positive control needs to know whether the engine's declared capacity could have
kept it). Problems of the checks in :data:`FINDINGS` are efficiency findings: recorded in the
report, not failed (:func:`triage`; render hygiene fails with ``strict_render``).

The speedup is judged on what reuse saves: the time to first token
(``Outcome.first_token_seconds``: lookup, restore and prefill; decoding costs the same warm
and cold, so a decode-heavy stream's whole calls hide any saving) when both runs of every hit
report it, else on whole calls, and the message and the reports name the measure
(:meth:`StreamEfficiency.speedup_times`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..checks import (
    CAPACITY,
    FIRST_TOKEN,
    HYGIENE,
    NO_SNAPSHOT,
    OLDER_ENTRY,
    UNDER_ONE_BLOCK,
    WHOLE_CALLS,
    Match,
    Problem,
    control_problems,
)
from ..output.report import Report
from ..output.reuse import add_reuse
from ..types import Outcome, Request

__all__ = [
    "FINDINGS",
    "REMEASURES",
    "FastestRuns",
    "StreamEfficiency",
    "first_token_times",
    "triage",
]

#: Checks whose problems are efficiency findings: recorded, not failed (render hygiene fails
#: with ``strict_render``).
FINDINGS = frozenset({CAPACITY, HYGIENE, NO_SNAPSHOT, OLDER_ENTRY, UNDER_ONE_BLOCK})
#: Replays of a stream whose speedup fell below the floor (:class:`FastestRuns`).
REMEASURES = 3


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
    first_warm: float = 0.0
    """Seconds to the first token of the cached runs of cache hits (those that report it)."""
    first_cold: float = 0.0
    """Seconds to the first token of the same requests' uncached runs."""
    hits: int = 0
    """Cache hits timed."""
    untimed_hits: int = 0
    """Cache hits one of whose runs reported no time to first token."""
    reused: int = 0
    """Tokens reused, each request's capped at what the declared reference allowed."""
    reusable: int = 0
    """Tokens the declared reference allowed."""
    footprint: int = 0
    """The previous request's prompt and output tokens (what each of its runs stored)."""

    def reset(self) -> None:
        self.warm = self.cold = self.first_warm = self.first_cold = 0.0
        self.hits = self.untimed_hits = 0
        self.reused = self.reusable = self.footprint = 0

    def add_times(
        self,
        report: Report,
        cached: Outcome,
        uncached: Outcome,
        warm: float,
        cold: float,
        skewed: object,
    ) -> None:
        """Count a cache hit's seconds (its two calls' ``warm`` and ``cold``, and each run's
        time to first token where it reports one), unless the engine says its uncached times
        are ``skewed`` (e.g. a server restarted for every uncached run): then no speedup is
        computed, nor shown anywhere."""
        if skewed:
            report.speedup_not_measured = str(skewed)
            report.warm_seconds = report.cold_seconds = 0.0
            report.warm_first_token = report.cold_first_token = 0.0
        elif cached.cached_tokens:
            self.hits += 1
            self.warm += warm
            self.cold += cold
            report.warm_seconds += warm
            report.cold_seconds += cold
            first = first_token_times(cached, uncached)
            if first is None:
                self.untimed_hits += 1
                report.untimed_hits += 1
            else:
                self.first_warm += first[0]
                self.first_cold += first[1]
                report.warm_first_token += first[0]
                report.cold_first_token += first[1]

    def speedup_times(self) -> tuple[str, float, float]:
        """The measure the speedup is judged on and its warm and cold seconds: the time to
        first token when both runs of every hit reported it, else whole calls."""
        if self.hits and not self.untimed_hits:
            return FIRST_TOKEN, self.first_warm, self.first_cold
        return WHOLE_CALLS, self.warm, self.cold

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


def first_token_times(cached: Outcome, uncached: Outcome) -> tuple[float, float] | None:
    """The two runs' times to first token, or None when either did not report one."""
    warm, cold = cached.first_token_seconds, uncached.first_token_seconds
    if warm is None or cold is None:
        return None
    return float(warm), float(cold)


Times = tuple[float, float]


def _fastest(best: Times | None, new: Times) -> Times:
    return new if best is None else (min(best[0], new[0]), min(best[1], new[1]))


@dataclass
class FastestRuns:
    """Each cache hit's fastest warm and fastest cold run over :data:`REMEASURES` replays of
    a stream whose speedup fell below the floor: waiting for a busy CPU only adds time, so
    the fastest run is the least noisy estimate of what a run costs."""

    whole: dict[int, Times] = field(default_factory=dict)
    first: dict[int, Times] = field(default_factory=dict)
    untimed: bool = False

    def add(self, index: int, cached: Outcome, uncached: Outcome, warm: float, cold: float) -> None:
        """Request ``index``'s two runs of one replay (counted when the cached one hit)."""
        if not cached.cached_tokens:
            return
        self.whole[index] = _fastest(self.whole.get(index), (warm, cold))
        first = first_token_times(cached, uncached)
        if first is None:
            self.untimed = True
        else:
            self.first[index] = _fastest(self.first.get(index), first)

    def speedup(self, measure: str) -> float:
        """Cold over warm seconds of the hits' fastest runs, on ``measure`` (whole calls when
        a replay's hit reported no time to first token)."""
        times = self.first if measure == FIRST_TOKEN and not self.untimed else self.whole
        warm = sum(w for w, _ in times.values())
        cold = sum(c for _, c in times.values())
        return cold / warm if warm > 0 else float("inf")
