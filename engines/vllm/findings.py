"""The findings of one vLLM CPU mode, and the table of all of them (used by vllm_cpu.sh).

Each mode's directory (``$VLLM_REPORTS/vllm-<mode>/``) holds what one run of
``engines/vllm/run.sh verify`` wrote there: ``suite.json`` (the plugin's JSON report of the
built-in suite), ``checks.xml`` (JUnit XML of engines/vllm/test_vllm_cpu.py, run with
``--runxfail``) and ``checks.jsonl``. The row and the counterexamples are engines/seed/findings.py's
(same fields, same corpus layout); what differs: the targeted checks' expected failures come
from engines/vllm/test_vllm_cpu.py, and efficiency is also given against the block-rounded oracle
(vLLM reuses whole 32-token blocks and recomputes at least the last prompt token).

    python engines/vllm/findings.py row DIR ENGINE VERSION MODE   writes DIR/row.json
    python engines/vllm/findings.py table REPORTS                 prints the Markdown table
    python engines/vllm/findings.py save REPORTS CORPUS           copies each failure's shrunk
                                                                   counterexample into CORPUS
                                                                   (not the negative control's)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # engines/: the lab package, also when loaded by path
from lab import findings as common  # noqa: E402

BLOCK = 32
SCRIPT = "engines/vllm/run.sh"
MODES = {
    "text": "tiny-llama-hf, text",
    "vl": "tiny-qwen2-vl-hf, images",
    "vl-patched": "negative control: tiny-qwen2-vl-hf, block hashes patched to ignore images",
}


def checks(path: Path, mode: str) -> dict[str, str]:
    """What happened to the checks of engines/vllm/test_vllm_cpu.py in ``mode``."""
    return common.mode_checks(path, "test_vllm_cpu", "VLLM_MODE", mode, HERE)


def block_oracle(suite: dict[str, Any]) -> tuple[int, int]:
    """(reused, block-rounded oracle) over the suite's request records that have an oracle
    figure: per request, the oracle's reusable tokens (at most the prompt less its last
    token) rounded down to whole blocks, and the reuse reported, capped at the oracle's."""
    reused = oracle = 0
    for r in suite.get("records", []):
        if r.get("reusable") is None or r.get("prompt_tokens") is None:
            continue
        best = min(int(r["reusable"]), int(r["prompt_tokens"]) - 1)
        rounded = BLOCK * (max(best, 0) // BLOCK)
        oracle += rounded
        reused += min(int(r.get("cached_tokens") or 0), int(r["reusable"]))
    return reused, oracle


def row(directory: Path, engine: str, version: str, mode: str) -> dict[str, Any]:
    r = common.row(directory, engine, version, mode, checks(directory / "checks.xml", mode))
    suite_path = directory / "suite.json"
    suite = json.loads(suite_path.read_text()) if suite_path.is_file() else {}
    r["block_reused"], r["block_oracle_tokens"] = block_oracle(suite)
    r["records"] = len(suite.get("records", []))
    return r


def _pct(part: int, whole: int) -> str:
    return "n/a" if not whole else f"{100 * part / whole:.1f}% ({part:,} of {whole:,})"


def table(reports: Path, corpus_link: str = "fixtures/corpus/third_party") -> str:
    lines = [
        "| engine, version | mode | requests | efficiency vs oracle | vs block-rounded oracle "
        "| worst diff | failures (shrunk counterexamples) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = [json.loads(p.read_text()) for p in sorted(reports.glob("vllm-*/row.json"))]
    order = list(MODES)
    for r in sorted(rows, key=lambda r: order.index(r["mode"]) if r["mode"] in order else 9):
        head = f"| {r['engine']} {r['version']} | {MODES.get(r['mode'], r['mode'])} |"
        if not r["suite_ran"]:
            lines.append(f"{head} the suite did not run | | | | |")
            continue
        lines.append(
            f"{head} {r['requests']} ({r['cache_hits']} hits) | "
            f"{_pct(r['reused_tokens'], r['oracle_tokens'])} | "
            f"{_pct(r['block_reused'], r['block_oracle_tokens'])} | {r['worst_diff']:g} | "
            f"{common._failures(r, corpus_link)} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    return common.engine_main(
        argv,
        row=row,
        table=table,
        prefix="vllm",
        findings=[m for m in MODES if not m.endswith("-patched")],  # not the negative control
        script=SCRIPT,
        usage=__doc__ or "",
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
