"""The session summary, one model for every place that shows it.

The terminal summary prints :meth:`Summary.lines`; the HTML page renders the same
:class:`Summary` as sections (:mod:`pytest_prefixcache.html.summary`). Neither computes a figure
of its own, so they cannot disagree on the engine and its tolerance rule, the efficiency and
the reference it is judged against, the failures, the efficiency findings, the skipped tests,
the coverage table or the verdict.

An efficiency is never shown beside a failed reuse bound: when the engine reported more reuse
than the token oracle allows on some request, its capped figure would read 100%, so the
summary says "not judged" and how many requests over-claimed instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks.coverage import CoverageRow, coverage_rows, row_lines
from .report_data import ReportData
from .reuse import efficiency_label, judged, references_line, totals

__all__ = ["FINDINGS_SHOWN", "Line", "Summary", "efficiency_line", "over_claims", "summarize"]

#: Finding examples shown under the counts (the JSON report keeps more).
FINDINGS_SHOWN = 3


@dataclass(frozen=True)
class Line:
    """One line of the summary: ``key`` names what it says (stable, for the HTML page and
    tests), ``tone`` is ``"bad"``, ``"good"`` or empty, ``sub`` indents it under the line
    before."""

    key: str
    text: str
    tone: str = ""
    sub: bool = False

    def terminal(self) -> str:
        return f"  {self.text}" if self.sub else self.text


@dataclass(frozen=True)
class Summary:
    """What the session verified, in the order the terminal prints it."""

    head: tuple[Line, ...]
    """The engine and its tolerance rule, requests, efficiency, differences, time, claims."""
    failures: tuple[Line, ...]
    """Failures by check, then each failure's replay command."""
    findings: tuple[Line, ...]
    """Efficiency findings by check, then the first few (empty when there are none)."""
    skipped: tuple[Line, ...]
    """Verification tests that were skipped and why (empty when none was)."""
    seed: tuple[Line, ...]
    coverage: tuple[CoverageRow, ...]
    verdict: str
    """``pass``, ``partial``, ``incomplete`` or ``fail``."""
    verdict_lines: tuple[Line, ...]
    """The verdict, then what to return to close each gap (or a matrix run's rows)."""

    def lines(self) -> list[str]:
        """The terminal summary, one line per item."""
        before = (*self.head, *self.failures, *self.findings, *self.skipped, *self.seed)
        return [
            *(line.terminal() for line in before),
            *row_lines(self.coverage),
            *(line.terminal() for line in self.verdict_lines),
        ]


def over_claims(report: ReportData) -> int:
    """Requests whose reported reuse exceeded the token oracle's maximum (the reuse bound):
    the report's count, or for an older report what its records show."""
    return max(report.over_claims, sum(r.over for r in report.records))


def efficiency_line(report: ReportData) -> Line:
    """The efficiency against the declared reference, or why it is not judged."""
    label = f"cache efficiency vs {efficiency_label(report)}: "
    over = over_claims(report)
    if over:
        return Line(
            "efficiency",
            label + f"not judged: {over} request(s) reported more reuse than the token oracle "
            "allows (reuse bound)",
            "bad",
        )
    eff = report.efficiency
    reused, reusable = judged(report)
    if eff is None:
        return Line("efficiency", label + "n/a (nothing was reusable)")
    return Line("efficiency", label + f"{eff:.1%} ({reused} of {reusable} reusable tokens)")


def _head(report: ReportData) -> list[Line]:
    worst = f"{report.worst_diff:.3g}"
    if report.worst_diff_where:
        worst += f" ({report.worst_diff_where})"
    exact = report.tolerance.strip() == "exact"
    workers = f" on {report.workers} workers" if report.workers else ""
    out = [
        Line(
            "engine",
            f"engine: {report.engine or '?'}; "
            + (f"model: {report.model}; " if report.model else "")
            + f"tolerance: {report.tolerance}",
        ),
        Line(
            "requests",
            f"requests run: {report.requests} in {report.streams} stream(s){workers}, "
            f"{report.cache_hits} with cache hits",
        ),
        efficiency_line(report),
        Line(
            "worst-diff",
            f"worst |cached - uncached|: {worst}",
            "bad" if exact and report.worst_diff != 0 else "",
        ),
        Line("merges", f"merges checked: {report.merges_checked}"),
    ]
    if report.decode_rule:
        out.insert(
            1,
            Line(
                "decode-rule",
                f"decode rule: {report.decode_rule}; applied to {report.decode_rule_requests} "
                "request(s) whose cached run reused KV computed while decoding",
            ),
        )
    if report.last_kv:
        out.insert(1, Line("last-kv", report.last_kv))
    if report.engine_error:
        out.insert(
            1, Line("engine-error", f"engine could not be built: {report.engine_error}", "bad")
        )
    side_by_side = references_line(report)
    if side_by_side and over_claims(report):
        capped = ", ".join(f"{a} of {b}" for a, b in totals(report).values())
        side_by_side = (
            "reuse per reference: not judged (the reuse bound failed); reported reuse capped "
            f"at each reference's maximum: {capped}"
        )
    if side_by_side:
        out.append(Line("references", side_by_side))
    if report.speedup_not_measured:
        why = report.speedup_not_measured
        out.append(Line("time", f"time on cache hits: no speedup computed ({why})"))
    elif report.warm_seconds > 0:
        out.append(Line("time", _time_line(report)))
    if report.claims_checked or report.steps_aligned:
        out.append(
            Line(
                "claims",
                f"claims checked against the model: {report.claims_checked} reuse figure(s), "
                f"{report.steps_aligned} decode step(s) aligned",
            )
        )
    if report.worst_kl:
        out.append(Line("kl", f"worst estimated KL: {report.worst_kl:.3g}"))
    return out


def _failures(report: ReportData) -> list[Line]:
    by = report.failures_by_check
    if not by:
        return [Line("failures", "failures by check: none", "good")]
    counts = ", ".join(f"{k}: {v}" for k, v in sorted(by.items()))
    out = [
        Line("failures", f"failures by check: {counts}", "bad"),
        *(Line("replay", f"replay: {f.replay}", sub=True) for f in report.failures if f.replay),
    ]
    first = report.first_failure
    if first is not None:
        ran = "" if first.streams is None else f", after {first.streams} stream(s) and "
        ran += "" if first.requests is None else f"{first.requests} request(s)"
        out.append(
            Line(
                "first-failure",
                f"first failure: {first.check}, {first.seconds:g} s after the session's start{ran}",
            )
        )
    if report.shrink_examples or report.shrink_skipped:
        out.append(
            Line(
                "shrinking",
                f"after a first failure: {report.shrink_examples} example(s) run (shrinking, "
                f"other bugs), {report.shrink_skipped} skipped past the shrink budget "
                "(--prefixcache-shrink-budget)",
            )
        )
    return out


def _findings(report: ReportData) -> list[Line]:
    if not report.findings:
        return []
    counts = ", ".join(f"{k}: {v}" for k, v in sorted(report.findings.items()))
    return [
        Line("findings", f"efficiency findings (not failures; see the README's tiers): {counts}"),
        *(Line("finding", line, sub=True) for line in report.finding_examples[:FINDINGS_SHOWN]),
    ]


def _skipped(report: ReportData) -> list[Line]:
    """The skipped tests, one line each; tests skipped for the same reason (the engine could
    not be built, or died) share one line."""
    if not report.skipped:
        return []
    by_reason: dict[str, list[str]] = {}
    for line in report.skipped:
        test, _, reason = line.partition(": ")
        by_reason.setdefault(reason, []).append(test)
    return [
        Line("skipped", f"skipped: {len(report.skipped)} verification test(s)"),
        *(
            Line(
                "skip",
                f"{tests[0]}: {reason}"
                if len(tests) == 1
                else f"{len(tests)} tests ({tests[0]}, ...): {reason}",
                sub=True,
            )
            for reason, tests in by_reason.items()
        ),
    ]


def summarize(report: ReportData) -> Summary:
    """The summary of ``report``."""
    seed = []
    if report.seed is not None:
        shards = f" --prefixcache-shards={report.shards}" if report.shards > 1 else ""
        if report.parallel_streams > 1:
            shards += f" --prefixcache-parallel-streams={report.parallel_streams}"
        seed.append(Line("seed", f"reproduce with --prefixcache-seed={report.seed}{shards}"))
    tone = {"pass": "good", "partial": "good"}.get(report.verdict, "bad")
    verdict = [
        Line("verdict", text, tone)
        if text.startswith("verdict:")
        else Line("verdict-detail", text.strip(), sub=text.startswith("  "))
        for text in report.verdict_lines()
    ]
    return Summary(
        head=tuple(_head(report)),
        failures=tuple(_failures(report)),
        findings=tuple(_findings(report)),
        skipped=tuple(_skipped(report)),
        seed=tuple(seed),
        coverage=tuple(coverage_rows(report.coverage)),
        verdict=report.verdict,
        verdict_lines=tuple(verdict),
    )


def _time_line(report: ReportData) -> str:
    """Time on cache hits on the measure the speedup is judged on: the time to first token
    (whole calls beside it), or whole calls, saying how many hits reported no first token."""
    whole = f"{report.warm_seconds:.2f} s warm vs {report.cold_seconds:.2f} s cold"
    whole += f" (speedup {report.cold_seconds / report.warm_seconds:.2f}x)"
    if report.untimed_hits or report.warm_first_token <= 0:
        why = ""
        if report.untimed_hits:
            why = f", {report.untimed_hits} hit(s) reporting no time to first token"
        return f"time on cache hits (whole calls{why}): {whole}"
    first = report.cold_first_token / report.warm_first_token
    return (
        f"time to first token on cache hits: {report.warm_first_token:.2f} s warm vs "
        f"{report.cold_first_token:.2f} s cold (speedup {first:.2f}x); whole calls: {whole}"
    )
