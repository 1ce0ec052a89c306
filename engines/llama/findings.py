"""The findings of one llama-server mode, and the table of all of them (used by llama_server.sh).

Each mode's directory (``$LLAMA_REPORTS/llama-<mode>/``) holds what one run of
``engines/llama/run.sh verify`` wrote there: ``suite.json`` (the plugin's JSON report of the
built-in suite), ``checks.xml`` (JUnit XML of engines/llama/test_llama_server.py, run with
``--runxfail``), ``atol.txt`` (the suite's ``--prefixcache-atol``) and ``checks.jsonl``
(per targeted comparison: reuse and worst difference; the tolerance measurement's sorted
differences). The row and the counterexamples are
engines/seed/findings.py's (same fields, same corpus layout); what differs: the expected
failures come from engines/llama/test_llama_server.py, each row states its tolerance and the
measured differences, and the negative control's failures are not saved as findings.

    python engines/llama/findings.py row DIR ENGINE VERSION MODE   writes DIR/row.json
    python engines/llama/findings.py table REPORTS                 prints the Markdown table
    python engines/llama/findings.py save REPORTS CORPUS           copies each failure's shrunk
                                                                    counterexample into CORPUS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # engines/: the lab package, also when loaded by path
from lab import findings as common  # noqa: E402
from lab.command_line import dispatch, mode_commands  # noqa: E402

SCRIPT = "engines/llama/run.sh"
COLUMNS = (
    "engine, version", "mode", "tolerance",
    "cached vs cold, measured (requests: worst, p90, median)", "requests",
    "efficiency vs oracle", "worst diff", "failures",
)  # fmt: skip
MODES = {
    "text": "tiny-llama.gguf, `-fa off`, f32 KV",
    "vl": "tiny-qwen2-vl.gguf + mmproj, images, `-fa off`, f32 KV",
    "text-fa": "tiny-llama.gguf, flash attention on (default), f16 KV",
    "vl-fa": "tiny-qwen2-vl.gguf + mmproj, images, flash attention on (default), f16 KV",
    "vl-fa-exact": "negative control: vl-fa judged exactly (atol 0)",
    "text-reuse": "tiny-llama.gguf, `-fa off`, f32 KV, `--cache-reuse 4` (KV shifting)",
    "text-lru": "tiny-llama.gguf, `-fa off`, f32 KV, `-sps 0` (slots by LRU only)",
    "swa": "tiny-gemma3-text.gguf (sliding window 32), `-fa off`, f32 KV, context checkpoints",
    "swa-full": "tiny-gemma3-text.gguf, `-fa off`, f32 KV, `--swa-full`",
}


def checks(path: Path, mode: str) -> dict[str, str]:
    """What happened to the checks of engines/llama/test_llama_server.py in ``mode``."""
    return common.mode_checks(path, "test_llama_server", "LLAMA_MODE", mode, HERE)


def measured(path: Path) -> dict[str, Any]:
    """The tolerance measurement of checks.jsonl: requests, worst, median and 90th percentile
    of the per-request worst differences (inf: greedy tokens differed)."""
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    for r in rows:
        if "diffs" in r:
            diffs = sorted(float(d) for d in r["diffs"])
            return {
                "requests": len(diffs),
                "worst": diffs[-1],
                "median": diffs[len(diffs) // 2],
                "p90": diffs[int(0.9 * (len(diffs) - 1))],
            }
    return {}


def row(directory: Path, engine: str, version: str, mode: str) -> dict[str, Any]:
    r = common.row(directory, engine, version, mode, checks(directory / "checks.xml", mode))
    r["tolerance"] = measured(directory / "checks.jsonl")
    atol = directory / "atol.txt"  # the --prefixcache-atol the script ran the suite with
    r["atol"] = atol.read_text().strip() if atol.is_file() else None
    return r


def _figure(value: float) -> str:
    return "inf" if value == float("inf") else f"{value:.2g}"


def table(reports: Path, corpus_link: str = "fixtures/corpus/third_party") -> str:
    lines: list[str] = []
    rows = [json.loads(p.read_text()) for p in sorted(reports.glob("llama-*/row.json"))]
    order = list(MODES)
    for r in sorted(rows, key=lambda r: order.index(r["mode"]) if r["mode"] in order else 9):
        t = r.get("tolerance") or {}
        figures = (
            f"{t['requests']}: {_figure(t['worst'])}, {_figure(t['p90'])}, {_figure(t['median'])}"
            if t
            else "not measured"
        )
        head = (
            f"| {r['engine']} {r['version']} | {MODES.get(r['mode'], r['mode'])} | "
            f"atol {r.get('atol') or '?'} | {figures} |"
        )
        if not r["suite_ran"]:
            lines.append(f"{head} the suite did not run | | | |")
            continue
        lines.append(
            f"{head} {r['requests']} ({r['cache_hits']} hits) | "
            f"{common.efficiency(r, thousands=False)} | "
            f"{r['worst_diff']:g} | {common._failures(r, corpus_link)} |"
        )
    return common.markdown(COLUMNS, lines)


def main(argv: list[str]) -> int:
    commands = mode_commands(
        row=row,
        table=table,
        prefix="llama",
        findings=[m for m in MODES if not m.endswith("-exact")],  # not the negative control
        script=SCRIPT,
    )
    return dispatch(argv, commands, __doc__ or "")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
