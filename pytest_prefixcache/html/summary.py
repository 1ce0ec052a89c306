"""The page's summary sections, rendered from the same :class:`~..output.summary.Summary` the
terminal prints: the verdict and the coverage table, the efficiency findings, the skipped
tests and the terminal's summary lines. Each line of the terminal is one element of class
``line`` here (a coverage row is a table row), with the same text."""

from __future__ import annotations

from collections.abc import Iterable
from html import escape

from ..output.summary import Line, Summary

__all__ = ["summary_sections"]


def _lines(lines: Iterable[Line]) -> str:
    items = "".join(
        f'<li class="line {line.tone}{" sub" if line.sub else ""}" '
        f'data-key="{escape(line.key)}">{escape(line.text)}</li>'
        for line in lines
    )
    return f'<ul class="lines">{items}</ul>'


def _coverage(summary: Summary) -> str:
    if not summary.coverage:
        return '<p class="caption" id="no-coverage">No coverage was recorded.</p>'
    rows = "".join(
        f'<tr class="line{" gap" if r.gap else ""}" data-check="{escape(r.check)}">'
        f'<td class="name">{escape(r.check)}</td><td class="ran">{r.ran}/{r.total}</td>'
        f'<td class="why">{escape(r.why)}</td></tr>'
        for r in summary.coverage
    )
    head = "".join(f"<th>{h}</th>" for h in ("Check", "Ran on", "Why not on the others"))
    return (
        '<table class="configs coverage" id="coverage-table">'
        f"<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
        '<p class="caption">Requests each check ran on / the requests that concern it. The cold '
        "baseline's row reads audited / all: the requests the audit did not sample are not a "
        "gap. The wave decode steps row counts decode steps: compared / generated. A "
        "highlighted row is a required check that could not run everywhere.</p>"
    )


def _findings(summary: Summary) -> str:
    body = (
        _lines(summary.findings)
        if summary.findings
        else '<p id="no-findings">No efficiency findings.</p>'
    )
    return (
        '<section class="card" id="findings"><h2>Efficiency findings</h2>'
        f"{body}"
        '<p class="caption">Findings are not failures: missed reuse the engine\'s design '
        "explains (no snapshot to resume from, less than one block) and render hygiene; render "
        "hygiene fails the run only when asked (--prefixcache-strict-render).</p></section>"
    )


def _skipped(summary: Summary) -> str:
    body = (
        _lines(summary.skipped)
        if summary.skipped
        else '<p id="no-skipped">No verification test was skipped.</p>'
    )
    return f'<section class="card" id="skipped"><h2>Skipped</h2>{body}</section>'


def summary_sections(summary: Summary) -> str:
    """The verdict, the coverage table, the findings, the skipped tests and the summary's
    other lines, as the terminal prints them."""
    return (
        '<section class="card" id="verdict-lines"><h2>Verdict</h2>'
        f"{_lines(summary.verdict_lines)}</section>"
        '<section class="card" id="coverage"><h2>Coverage</h2>'
        f"{_coverage(summary)}</section>"
        f"{_findings(summary)}{_skipped(summary)}"
        '<section class="card" id="summary-lines"><h2>Summary</h2>'
        f"{_lines((*summary.head, *summary.failures, *summary.seed))}"
        '<p class="caption">The terminal summary\'s lines; the verdict, the coverage table, the '
        "findings and the skipped tests are above.</p></section>"
    )
