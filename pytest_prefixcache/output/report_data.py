"""The session report's data: the counters the checks fill in and the verdict they give.

:class:`ReportData` is what the terminal summary (:mod:`.summary`) and the JSON form
(:mod:`.report_json`) read; :class:`.report.Report` adds those two views on top, so the views
import the data and never the class that uses them (no circle).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from ..checks.coverage import gap_lines, missing
from ..checks.timing import FIRST_TOKEN, WHOLE_CALLS
from .matrix import config_lines, worst
from .records import FailureRecord, FirstFailure, RequestRecord
from .reuse import MIXED, efficiency_label, judged, totals

__all__ = ["INCONCLUSIVE", "MAX_MESSAGE", "MAX_RECORDS", "ReportData"]

#: The finding of a wave failure not confirmed one request at a time (``verify.confirm``).
INCONCLUSIVE = "inconclusive (guessed attribution)"

#: Per-request records kept in one report (the counters always cover every request).
MAX_RECORDS = 20_000
#: Characters of a failure's full message kept in the report.
MAX_MESSAGE = 8_000
#: Efficiency findings kept in full (all are counted).
MAX_FINDING_EXAMPLES = 20


#: Report counters that add up across workers.
_SUMMED = (
    "requests", "cache_hits", "reused_tokens", "oracle_tokens", "streams", "merges_checked",
    "warm_seconds", "cold_seconds", "warm_first_token", "cold_first_token", "untimed_hits",
    "records_dropped", "claims_checked", "steps_aligned",
    "snapshot_reused", "snapshot_tokens", "block_reused", "block_tokens", "starts_unknown",
    "over_claims", "decode_rule_requests", "shrink_examples", "shrink_skipped",
)  # fmt: skip


@dataclass
class ReportData:
    """What the verification saw in this session (the data; :class:`.report.Report` its views)."""

    seed: int | None = None
    shards: int = 1
    parallel_streams: int = 1
    """``--prefixcache-parallel-streams`` (the reproduce line repeats it: other streams drawn)."""
    engine: str = ""
    model: str | None = None
    """The model directory the engine factories were given (``--prefixcache-model``); None:
    each engine's own."""
    tolerance: str = "exact"
    decode_rule: str = ""
    """The decode rule (the tolerance of requests that reused decode-time KV), when the
    engine declares one."""
    decode_rule_requests: int = 0
    """Requests judged by the decode rule."""
    requests: int = 0
    cache_hits: int = 0
    reused_tokens: int = 0
    """Reported reuse, capped at the token oracle's maximum, summed (see :mod:`.reuse`)."""
    oracle_tokens: int = 0
    """The token oracle's maximum valid reuse, summed."""
    reference: str = "token"
    """The reference the engine's design declares: its efficiency is judged against it."""
    block_size: int | None = None
    """A block-granular design's block size."""
    snapshot_reused: int = 0
    snapshot_tokens: int = 0
    block_reused: int = 0
    block_tokens: int = 0
    starts_unknown: int = 0
    """Requests with token ids but no message starts (their snapshot-aware boundaries are
    image edges and prompt ends only)."""
    shrink_examples: int = 0
    """Examples run on the engine after a property's first failure (shrinking and looking for
    other bugs; bounded by ``--prefixcache-shrink-budget``, :mod:`..verify.shrink_budget`)."""
    shrink_skipped: int = 0
    """Examples Hypothesis drew once a property's shrink budget was spent: never run."""
    over_claims: int = 0
    """Requests whose reported reuse exceeded the correctness bound (the reuse bound failed)."""
    last_kv: str = ""
    """Whether the engine's decode computes its last token's KV, and how that was learned
    (:mod:`pytest_prefixcache.verify.decode_kv`): what the reuse bound counted."""
    worst_diff: float = 0.0
    worst_diff_where: str = ""
    worst_kl: float = 0.0
    merges_checked: int = 0
    streams: int = 0
    warm_seconds: float = 0.0
    """Engine time of the cached runs that hit the cache."""
    cold_seconds: float = 0.0
    """Engine time of the uncached runs of the same requests."""
    warm_first_token: float = 0.0
    """Time to first token of the cached runs that hit the cache (those that report it:
    ``Outcome.first_token_seconds``)."""
    cold_first_token: float = 0.0
    """Time to first token of the uncached runs of the same requests."""
    untimed_hits: int = 0
    """Cache hits one of whose runs reported no time to first token (then the speedup is
    judged on whole calls)."""
    speedup_not_measured: str = ""
    """Why no warm/cold time was compared (the engine's ``uncached_times_skewed``: e.g. its
    uncached runs restart a server), else empty."""
    failures: list[FailureRecord] = field(default_factory=list)
    first_failure: FirstFailure | None = None
    """When the first failure of any kind happened (:meth:`mark_failure`; the earliest of the
    workers' and configurations')."""
    slowest_call: float = 0.0
    """The longest an engine call took to answer (a wave's requests: from its last arrival):
    what ``--prefixcache-timeout`` bounds, so a timeout can be set from it."""
    records: list[RequestRecord] = field(default_factory=list)
    records_dropped: int = 0
    workers: int = 0
    """pytest-xdist workers merged into this report (0: the run was not distributed)."""
    engine_error: str = ""
    """Why the engine could not be built, when it could not."""
    server: bool = False
    """The engine is an OpenAI-compatible server (its ``coverage_hints`` is ``"server"``):
    the verdict's advice names the ``PREFIXCACHE_*`` settings, not Outcome fields."""
    coverage: dict[str, dict[str, int]] = field(default_factory=dict)
    """check -> {"applied": requests it applied to, reason: requests it could not run on}."""
    allow_partial: bool = False
    """The user accepts a PASS when some correctness check could not run (said as such)."""
    claims_checked: int = 0
    """Reuse figures the engine claimed that were compared with what its model computed."""
    steps_aligned: int = 0
    """Decode steps whose API logprobs were aligned with the model's (the claims check)."""
    findings: dict[str, int] = field(default_factory=dict)
    """Efficiency findings that did not fail the run: check -> how many."""
    finding_examples: list[str] = field(default_factory=list)
    """The first few findings, one line each."""
    skipped: list[str] = field(default_factory=list)
    """Verification tests that were skipped, one line each: ``test id: reason``."""
    configs: list[dict[str, Any]] = field(default_factory=list)
    """A matrix run's rows, one per configuration (name, engine, verdict, coverage, counters);
    the verdict is the worst row's."""
    run: dict[str, Any] = field(default_factory=dict)
    """The run's settings, as its run file holds them (:mod:`.run_file`): what a replay
    applies (flags, environment) and what the run was (interpreter, version, tolerance rule)."""
    run_file: str = ""
    """The run file written beside the saved failing streams (empty: none was written)."""

    def add_finding(self, check: str, line: str) -> None:
        """An efficiency finding that does not fail the run (reported everywhere)."""
        self.findings[check] = self.findings.get(check, 0) + 1
        if len(self.finding_examples) < MAX_FINDING_EXAMPLES:
            self.finding_examples.append(f"{check}: {line}")

    def mark_failure(self, check: str, seconds: float, *, counted: bool = True) -> None:
        """A failure of ``check`` happened ``seconds`` after the session's start: kept when it
        is the first (``counted``: with the streams and requests run by then)."""
        if self.first_failure is None or seconds < self.first_failure.seconds:
            streams, requests = (self.streams, self.requests) if counted else (None, None)
            self.first_failure = FirstFailure(round(seconds, 1), check, streams, requests)

    def count(self, check: str, outcome: str, n: int = 1) -> None:
        """One request (``n`` of them, or of a row's units) that ``check`` applied to
        (``APPLIED``) or could not run on (a reason)."""
        row = self.coverage.setdefault(check, {})
        row[outcome] = row.get(outcome, 0) + n

    @property
    def not_checked(self) -> dict[str, dict[str, int]]:
        """The required checks that could not run on some request: check -> reason -> n."""
        return missing(self.coverage)

    @property
    def verdict(self) -> str:
        """``pass``, ``partial`` (a pass the user accepted with checks that could not run),
        ``fail`` (a failure), ``inconclusive`` (no failure, but a wave failure that rested on a
        guessed attribution did not reproduce one request at a time: neither a pass nor a
        proven failure), ``error`` (the engine could not be built: nothing was verified)
        or ``incomplete`` (no request was verified, or a correctness check could not run and
        partial coverage was not accepted). A matrix run's is the worst of its
        configurations'."""
        if self.configs:
            return worst(c["verdict"] for c in self.configs)
        if self.engine_error:
            return "error"
        if self.failures:
            return "fail"
        if self.findings.get(INCONCLUSIVE):
            return "inconclusive"
        if self.requests == 0:
            return "incomplete"
        if self.not_checked:
            return "partial" if self.allow_partial else "incomplete"
        return "pass"

    def verdict_lines(self) -> list[str]:
        """The verdict and, when coverage is incomplete, what the engine must return."""
        gaps = self.not_checked
        names = ", ".join(gaps)
        word = {
            "pass": "PASS",
            "fail": "FAIL",
            "inconclusive": f"INCONCLUSIVE: {self.findings.get(INCONCLUSIVE, 0)} wave failure(s) "
            "rested on the tap's guess of a request's rows and did not reproduce one request "
            "at a time (the findings say which)",
            "error": "ERROR: the engine could not be built (exit code 2)",
            "partial": f"PASS (partial: not checked on every request: {names})",
            "incomplete": "INCOMPLETE: "
            + (
                "no request was verified"
                if self.requests == 0
                else f"not checked on every request: {names}; "
                "--prefixcache-allow-partial accepts that"
            ),
        }[self.verdict]
        if self.configs:
            return [*config_lines(self.configs), f"verdict: {word} (the worst configuration's)"]
        return [f"verdict: {word}", *gap_lines(gaps, server=self.server)]

    @property
    def speedup_measure(self) -> str:
        """What the time on cache hits is shown and judged on: :data:`FIRST_TOKEN` when every
        hit's runs reported it, else :data:`WHOLE_CALLS` ("" when no hit was timed)."""
        if self.speedup_not_measured or self.warm_seconds <= 0:
            return ""
        return WHOLE_CALLS if self.untimed_hits else FIRST_TOKEN

    @property
    def efficiency(self) -> float | None:
        """Reused tokens / the declared reference's maximum (None when nothing was
        reusable)."""
        reused, reusable = judged(self)
        return reused / reusable if reusable else None

    def judged_reuse(self) -> tuple[int, int]:
        """(tokens reused, tokens reusable) against the declared reference."""
        return judged(self)

    def reuse_totals(self) -> dict[str, tuple[int, int]]:
        """Reference -> (tokens reused, tokens it allowed), see :mod:`.reuse`."""
        return totals(self)

    @property
    def judged_against(self) -> str:
        """The reference the efficiency is judged against, in words."""
        return efficiency_label(self)

    @property
    def failures_by_check(self) -> dict[str, int]:
        return dict(Counter(f.check for f in self.failures))

    def add_diff(self, diff: float, where: str) -> None:
        if diff > self.worst_diff or (diff != diff):  # NaN counts as worst
            self.worst_diff, self.worst_diff_where = diff, where

    def add_record(self, record: RequestRecord) -> None:
        if len(self.records) < MAX_RECORDS:
            self.records.append(record)
        else:
            self.records_dropped += 1

    def merge(self, other: ReportData, worker: str = "") -> None:
        """Add ``other`` (a worker's report) to this one; its records are tagged ``worker``."""
        if other.requests and other.reference != self.reference:  # the first one's, or mixed
            self.reference = other.reference if self.requests == 0 else MIXED
        self.block_size = self.block_size or other.block_size
        for name in _SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.shards = max(self.shards, other.shards)
        self.parallel_streams = max(self.parallel_streams, other.parallel_streams)
        where = f"{worker}: {other.worst_diff_where}" if worker else other.worst_diff_where
        self.add_diff(other.worst_diff, where)
        self.worst_kl = max(self.worst_kl, other.worst_kl)
        self.slowest_call = max(self.slowest_call, other.slowest_call)
        first = other.first_failure
        if first is not None and (
            self.first_failure is None or first.seconds < self.first_failure.seconds
        ):
            self.first_failure = first
        self.failures.extend(f if f.worker else replace(f, worker=worker) for f in other.failures)
        for r in other.records:
            self.add_record(r if r.worker else replace(r, worker=worker))
        self.workers += 1 if worker else other.workers
        self.engine_error = self.engine_error or other.engine_error
        self.speedup_not_measured = self.speedup_not_measured or other.speedup_not_measured
        self.server = self.server or other.server
        self.model = self.model or other.model
        if other.tolerance != "exact":  # the engine's own rule, known where it was built
            self.tolerance = other.tolerance
        self.decode_rule = self.decode_rule or other.decode_rule
        self.last_kv = self.last_kv or other.last_kv
        if other.run:  # a worker's (it built the engine: its tolerance rule is known)
            self.run = other.run
        self.run_file = self.run_file or other.run_file
        for check, n in other.findings.items():
            self.findings[check] = self.findings.get(check, 0) + n
        room = MAX_FINDING_EXAMPLES - len(self.finding_examples)
        self.finding_examples.extend(other.finding_examples[: max(0, room)])
        self.skipped.extend(other.skipped)
        for check, row in other.coverage.items():
            mine = self.coverage.setdefault(check, {})
            for key, n in row.items():
                mine[key] = mine.get(key, 0) + n
