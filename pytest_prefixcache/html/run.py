"""The page's run section: the settings a replay applies (the run file's flags and
environment), the interpreter, the package version and the tolerance rule in force, so that a
CI artifact says how to reproduce its own failures."""

from __future__ import annotations

import shlex
from html import escape
from typing import Any

from ..output.report import Report

__all__ = ["run_section"]


def _row(name: str, value: str) -> str:
    return f"<tr><th>{escape(name)}</th><td><code>{escape(value)}</code></td></tr>"


def _table(run: dict[str, Any], run_file: str) -> str:
    rows = []
    if run_file:
        rows.append(_row("run file", run_file))
    for key, label in (("python", "interpreter"), ("version", "pytest-prefixcache"),
                       ("directory", "directory"), ("engine", "engine"), ("model", "model"),
                       ("tolerance", "tolerance rule"), ("decode_rule", "decode rule"),
                       ("seed_options", "seed")):  # fmt: skip
        if run.get(key):
            rows.append(_row(label, str(run[key])))
    flags = run.get("flags") or []
    rows.append(_row("flags", shlex.join(str(f) for f in flags)))
    env = run.get("environment") or {}
    rows += [_row(str(k), str(v)) for k, v in env.items()] or [_row("environment", "(none)")]
    withheld = run.get("withheld") or []
    if withheld:  # may hold a credential: not written, a replay takes the shell's own
        rows.append(_row("withheld (set in your shell)", " ".join(map(str, withheld))))
    return f'<table class="configs run">{"".join(rows)}</table>'


def run_section(report: Report) -> str:
    """The run's settings (a matrix run: each configuration's), or nothing for a report
    written before reports carried them."""
    runs = [("", report.run, report.run_file)] if report.run else []
    runs += [
        (str(c.get("name", "")), c["run"], str(c.get("run_file", "")))
        for c in report.configs
        if c.get("run")
    ]
    if not runs:
        return ""
    body = "".join(
        (f"<h3><code>{escape(name)}</code></h3>" if name else "") + _table(run, run_file)
        for name, run, run_file in runs
    )
    return (
        '<section class="card" id="run"><h2>Run settings</h2>'
        '<p class="caption">What a replay applies: <code>prefixcache replay --run RUN_FILE '
        "STREAM</code> sets these flags and variables (and unsets the shell's other "
        "PREFIXCACHE_* ones) in the run's directory. Keep the run file with the saved streams "
        f"in a CI artifact.</p>{body}</section>"
    )
