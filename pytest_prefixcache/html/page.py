"""The whole page: header with the verdict and counters, the two charts, the failures."""

from __future__ import annotations

import math
import os
from html import escape
from pathlib import Path

from ..output.report import FORMAT, FailureRecord, Report
from ..output.summary import over_claims, summarize
from .charts import MAX_BARS, diff_chart, reuse_chart
from .conversation import find_stream_dir, render_stream
from .reuse import references_table
from .run import run_section
from .style import CSS
from .summary import summary_sections

__all__ = ["render_html", "write_html"]


def _stat(label: str, value: str, detail: str = "", tone: str = "") -> str:
    cls = f"stat {tone}".strip()
    extra = f'<div class="detail">{escape(detail)}</div>' if detail else ""
    return (
        f'<div class="{cls}"><div class="label">{escape(label)}</div>'
        f'<div class="value">{escape(value)}</div>{extra}</div>'
    )


def _seconds(x: float) -> str:
    return f"{x:.3g} s" if x < 10 else f"{x:.1f} s"


def verdict(report: Report) -> tuple[str, str]:
    """``(css class, text)``, from the report's own verdict: ERROR when the engine could not
    be built, fail on any failure, empty when nothing ran, partial or incomplete when a check
    could not run."""
    if report.engine_error or report.verdict == "error":
        return "fail", "ERROR: the engine could not be built"
    if report.failures or report.verdict == "fail":
        n = len(report.failures)
        if n:
            return "fail", f"FAIL: {n} failure{'s' if n != 1 else ''}"
        return "fail", "FAIL: see the configurations"
    if report.requests == 0:
        return "empty", "NOTHING VERIFIED"
    gaps = ", ".join(report.not_checked) or "see the configurations"
    if report.verdict == "inconclusive":
        return "empty", "INCONCLUSIVE: a wave failure rested on a guessed attribution"
    if report.verdict == "incomplete":
        return "empty", f"INCOMPLETE: not checked on every request: {gaps}"
    if report.verdict == "partial":
        return "pass", f"PASS (partial: not checked on every request: {gaps})"
    return "pass", "PASS"


def _efficiency(report: Report, over: int) -> str:
    """The efficiency tile: never a figure beside a failed reuse bound (see
    :mod:`~pytest_prefixcache.output.summary`)."""
    eff = report.efficiency
    reused, reusable = report.judged_reuse()
    if over:
        detail = f"{over} request(s) reported more reuse than the token oracle allows"
        return _stat("Efficiency", "not judged", detail, "bad")
    if eff is None:
        return _stat("Efficiency", "n/a", f"nothing was reusable (vs {report.judged_against})")
    detail = f"{reused} of {reusable} reusable tokens, vs {report.judged_against}"
    return _stat("Efficiency", f"{eff:.1%}", detail)


def _header(report: Report) -> str:
    tone, text = verdict(report)
    over = over_claims(report)
    shards = getattr(report, "shards", 1)
    seed_flag = ""
    if report.seed is not None:
        seed_flag = f"--prefixcache-seed={report.seed}"
        seed_flag += f" --prefixcache-shards={shards}" if shards > 1 else ""
    hits = f"{report.cache_hits / report.requests:.0%} of requests" if report.requests else ""
    speed, warm, cold = "", report.warm_seconds, report.cold_seconds
    measure = "whole calls"
    if not report.untimed_hits and report.warm_first_token > 0:
        warm, cold = report.warm_first_token, report.cold_first_token
        measure = report.speedup_measure
    if warm > 0 and cold > 0:
        speed = f"cold / warm: {cold / warm:.2f}x on cache hits, {measure}"
    worst = "NaN" if math.isnan(report.worst_diff) else f"{report.worst_diff:.3g}"
    exact = report.tolerance.strip() == "exact"
    per_stream = f"{report.requests / report.streams:.1f} requests each" if report.streams else ""
    by_check = ", ".join(f"{k}: {v}" for k, v in sorted(report.failures_by_check.items()))
    stats = [
        _stat("Seed", "?" if report.seed is None else str(report.seed), seed_flag, "wide seed"),
        _stat("Tolerance", report.tolerance or "?"),
        _stat("Requests", str(report.requests), f"{len(report.records)} drawn below"),
        _stat("Streams", str(report.streams), per_stream),
        _stat(
            "Workers",
            str(report.workers) if report.workers else "1",
            "" if report.workers else "not distributed",
        ),
        _stat("Cache hits", str(report.cache_hits), hits),
        _efficiency(report, over),
        _stat(
            "Reported > oracle",
            str(over),
            "requests claiming impossible reuse",
            "bad" if over else "good",
        ),
        _stat(
            "Worst logit difference",
            worst,
            report.worst_diff_where,
            "bad" if exact and report.worst_diff != 0 else "",
        ),
        _stat(
            "Warm vs cold time",
            f"{_seconds(warm)} vs {_seconds(cold)}",
            speed,
            "wide",
        ),
        _stat("Merges checked", str(report.merges_checked), "slots == embedding rows"),
        _stat(
            "Failures",
            str(len(report.failures)),
            by_check or "none",
            "wide bad" if report.failures else "wide good",
        ),
    ]
    if report.worst_kl:
        stats.append(_stat("Worst estimated KL", f"{report.worst_kl:.3g}"))
    if report.claims_checked or report.steps_aligned:
        figures = f"{report.claims_checked} reuse figures, {report.steps_aligned} decode steps"
        stats.append(_stat("Claims checked", figures, "against what the model computed", "wide"))
    error = ""
    if report.engine_error:
        error = (
            f'<p class="note error">The engine could not be built: '
            f"{escape(report.engine_error)}</p>"
        )
    model = f" on model {escape(report.model)}" if report.model else ""
    return (
        '<section class="card" id="summary"><div class="header"><div class="title">'
        f"<h1>pytest-prefixcache report</h1>"
        f'<div class="engine">{escape(report.engine or "engine not recorded")}{model}</div></div>'
        f'<div id="verdict" class="verdict {tone}">{escape(text)}</div></div>'
        f'{error}<div class="stats">{"".join(stats)}</div></section>'
    )


def _configs(report: Report) -> str:
    """A matrix run's verdict table: one row per configuration."""
    if not report.configs:
        return ""
    rows = []
    for c in report.configs:
        word = str(c.get("verdict", "?"))
        tone = {"pass": "good", "partial": "good"}.get(word, "bad")
        by = c.get("failures_by_check") or {}
        fails = ", ".join(f"{k}: {v}" for k, v in sorted(by.items())) or "none"
        if c.get("engine_error"):
            fails = f"engine could not be built: {c['engine_error']}"
        cells = [
            f'<td class="name"><code>{escape(str(c.get("name", "")))}</code></td>',
            f'<td class="{tone}">{escape(word.upper())}</td>',
            f"<td>{escape(str(c.get('engine', '')))}"
            + (f" on model {escape(str(c['model']))}" if c.get("model") else "")
            + "</td>",
            f"<td>{int(c.get('requests', 0))}</td><td>{int(c.get('cache_hits', 0))}</td>",
            f"<td>{escape(fails)}</td>",
        ]
        rows.append(f"<tr>{''.join(cells)}</tr>")
    head = "".join(
        f"<th>{h}</th>"
        for h in ("Configuration", "Verdict", "Engine", "Requests", "Hits", "Failures")
    )
    return (
        f'<section class="card" id="configs"><h2>Configurations ({len(report.configs)})</h2>'
        f'<table class="configs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody>'
        '</table><p class="caption">The verdict above is the worst configuration\'s.</p></section>'
    )


def _charts(report: Report) -> str:
    notes = []
    if report.records_dropped:
        notes.append(
            f"{report.records_dropped} request(s) ran after the per-request record limit and "
            "are counted above but not drawn."
        )
    if len(report.records) > MAX_BARS:
        notes.append(f"More than {MAX_BARS} requests: each bar is the maximum of a group.")
    if report.workers:
        notes.append("Requests of the workers follow each other (worker by worker).")
    note = "".join(f'<p class="caption">{escape(n)}</p>' for n in notes)
    tol = escape(report.tolerance)
    return (
        '<section class="card" id="reuse"><h2>Reuse per request against the oracle</h2>'
        f"{references_table(report)}{reuse_chart(report.records)}"
        '<p class="caption">Grey: the most prompt tokens the token oracle says could validly come '
        "from the cache; blue: what the engine reported as cached. Red bars, flagged above the "
        "plot, report more reuse than the oracle allows (the engine served a prefix it should not "
        f"have); grey above blue is reuse left on the table.</p>{note}</section>"
        '<section class="card" id="diffs"><h2>Distribution of logit differences</h2>'
        f"{diff_chart(report.records, report.tolerance)}"
        '<p class="caption">Each request\'s worst |cached - uncached| logit difference over '
        f"the compared positions, on a log scale; tolerance: <code>{tol}</code>.</p></section>"
    )


def _failure(i: int, f: FailureRecord, base_dir: str | os.PathLike[str] | None) -> str:
    meta = []
    if f.worker:
        meta.append(f"worker {f.worker}")
    if f.request_index is not None:
        meta.append(f"failing request {f.request_index}")
    parts = [
        f'<section class="card failure" id="failure-{i}" data-check="{escape(f.check)}">',
        f'<div class="head"><span class="badge check">{escape(f.check)}</span>'
        f'<h3 class="test">{escape(f.test)}</h3>'
        f'<span class="muted">{escape(" · ".join(meta))}</span></div>',
        f'<p class="summary">{escape(f.summary)}</p>',
    ]
    if f.replay:
        parts.append(
            f'<div class="section-label">Replay</div><pre class="replay">{escape(f.replay)}</pre>'
        )
    parts.append(
        '<div class="section-label">Message</div>'
        f'<pre class="message">{escape(f.message or f.summary)}</pre>'
    )
    parts.append('<div class="section-label">Failing stream</div>')
    directory = find_stream_dir(f.stream_dir, base_dir)
    if directory is not None:
        parts.append(render_stream(directory, f.request_index))
    elif f.stream_dir:
        parts.append(
            '<p class="note missing-stream">The saved stream is not there: '
            f"<code>{escape(f.stream_dir)}</code> holds no {escape('stream.json')} "
            "(was the report moved without its .prefixcache/failures/ directory?)</p>"
        )
    else:
        parts.append('<p class="note missing-stream">No stream was saved for this failure.</p>')
    parts.append("</section>")
    return "".join(parts)


def _failures(report: Report, base_dir: str | os.PathLike[str] | None) -> str:
    if not report.failures:
        text = "every check passed" if report.requests else "but no request was verified"
        return (
            '<section class="card" id="failures"><h2>Failures</h2>'
            f'<p id="no-failures">No failures: {text}.</p></section>'
        )
    toc = "".join(
        f'<li><a href="#failure-{i}">{escape(f.check)}</a>: <code>{escape(f.test)}</code></li>'
        for i, f in enumerate(report.failures, 1)
    )
    items = "".join(_failure(i, f, base_dir) for i, f in enumerate(report.failures, 1))
    return (
        f'<section class="card" id="failures"><h2>Failures ({len(report.failures)})</h2>'
        f'<ol class="toc">{toc}</ol></section>{items}'
    )


def render_html(report: Report, *, base_dir: str | os.PathLike[str] | None = None) -> str:
    """One self-contained HTML page for ``report``: no network, images inlined as data URIs,
    charts as inline SVG. ``base_dir`` (the report file's directory) resolves relative and
    moved ``stream_dir`` paths, see :func:`~pytest_prefixcache.html.conversation.find_stream_dir`.
    """
    tone, text = verdict(report)
    title = f"{text} - {report.engine or 'pytest-prefixcache'}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "img-src data:; style-src 'unsafe-inline'\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head>"
        f'<body class="{tone}"><main>{_header(report)}{summary_sections(summarize(report))}'
        f"{_configs(report)}{_charts(report)}"
        f"{_failures(report, base_dir)}{run_section(report)}"
        "<footer>pytest-prefixcache · report format "
        f"{escape(FORMAT)}</footer></main></body></html>\n"
    )


def write_html(
    report: Report,
    path: str | os.PathLike[str],
    *,
    base_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Write :func:`render_html` to ``path`` (creating its directory) and return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(report, base_dir=base_dir), encoding="utf-8")
    return out
