"""The findings of one llama-server mode, and the table of all of them (used by llama_server.sh).

Each mode's directory (``$LLAMA_REPORTS/llama-<mode>/``) holds what one run of
``scripts/llama_server.sh verify`` wrote there: ``suite.json`` (the plugin's JSON report of the
built-in suite), ``checks.xml`` (JUnit XML of tests/test_adapters_llama.py, run with
``--runxfail``), ``atol.txt`` (the suite's ``--prefixcache-atol``) and ``checks.jsonl``
(per targeted comparison: reuse and worst difference; the tolerance measurement's sorted
differences). The row and the counterexamples are
scripts/seed_findings.py's (same fields, same corpus layout); what differs: the expected
failures come from tests/test_adapters_llama.py, each row states its tolerance and the
measured differences, and the negative control's failures are not saved as findings.

    python scripts/llama_findings.py row DIR ENGINE VERSION MODE   writes DIR/row.json
    python scripts/llama_findings.py table REPORTS                 prints the Markdown table
    python scripts/llama_findings.py save REPORTS CORPUS           copies each failure's shrunk
                                                                    counterexample into CORPUS
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import seed_findings

TESTS = Path(__file__).resolve().parent.parent / "tests"
SCRIPT = "scripts/llama_server.sh"
MODES = {
    "text": "tiny-llama.gguf, `-fa off`, f32 KV",
    "vl": "tiny-qwen2-vl.gguf + mmproj, images, `-fa off`, f32 KV",
    "text-fa": "tiny-llama.gguf, flash attention on (default), f16 KV",
    "vl-fa": "tiny-qwen2-vl.gguf + mmproj, images, flash attention on (default), f16 KV",
    "vl-fa-exact": "negative control: vl-fa judged exactly (atol 0)",
}


def known(mode: str) -> dict[str, str]:
    """tests/test_adapters_llama.py's strict xfails for ``mode``, by test node name."""
    os.environ.setdefault("LLAMA_MODE", mode)
    sys.path.insert(0, str(TESTS))
    import test_adapters_llama

    return {name: why for (m, name), why in test_adapters_llama.KNOWN.items() if m == mode}


def checks(path: Path, mode: str) -> dict[str, str]:
    """``seed_findings.junit_outcomes`` against tests/test_adapters_llama.py's strict xfails."""
    reasons = known(mode)
    return seed_findings.junit_outcomes(path, lambda name: name in reasons)


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
    r = seed_findings.row(directory, engine, version, mode)
    r["checks"] = checks(directory / "checks.xml", mode)
    r["tolerance"] = measured(directory / "checks.jsonl")
    atol = directory / "atol.txt"  # the --prefixcache-atol the script ran the suite with
    r["atol"] = atol.read_text().strip() if atol.is_file() else None
    return r


def _figure(value: float) -> str:
    return "inf" if value == float("inf") else f"{value:.2g}"


def table(reports: Path, corpus_link: str = "fixtures/corpus/third_party") -> str:
    lines = [
        "| engine, version | mode | tolerance | cached vs cold, measured (requests: worst, "
        "p90, median) | requests | efficiency vs oracle | worst diff | failures |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
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
        eff = r["efficiency"]
        eff_text = "n/a" if eff is None else f"{100 * eff:.1f}%"
        eff_text += f" ({r['reused_tokens']} of {r['oracle_tokens']})"
        lines.append(
            f"{head} {r['requests']} ({r['cache_hits']} hits) | {eff_text} | "
            f"{r['worst_diff']:g} | {seed_findings._failures(r, corpus_link)} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "row":
        directory = Path(argv[1])
        r = row(directory, *argv[2:5])
        (directory / "row.json").write_text(json.dumps(r, indent=1) + "\n")
        print(json.dumps({k: r[k] for k in ("engine", "mode", "requests", "efficiency")}))
        return 0
    if len(argv) == 2 and argv[0] == "table":
        print(table(Path(argv[1])))
        return 0
    if len(argv) == 3 and argv[0] == "save":
        for mode in MODES:
            if mode.endswith("-exact"):  # the negative control is no finding about llama.cpp
                continue
            pattern = f"llama-{mode}/row.json"
            for name in seed_findings.save(Path(argv[1]), Path(argv[2]), pattern, SCRIPT):
                print(f"saved {Path(argv[2]) / name}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
