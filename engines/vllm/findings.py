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

The matrix (``engines/vllm/run.sh matrix``): a run directory holds one folder per combination of
engines/vllm/matrix.toml, each with the ``suite.json`` of its own ``--prefixcache-matrix
--prefixcache-config NAME`` run.

    python engines/vllm/findings.py matrix RUN MATRIX VERSION     writes RUN/<combination>/row.json
    python engines/vllm/findings.py matrix-table RUN...           prints the Markdown table
    python engines/vllm/findings.py matrix-json RUN...            prints the rows' figures (JSON)
    python engines/vllm/findings.py save-matrix RUN CORPUS        saves the counterexamples as
                                                                   vllm-cpu-<labels>-<check>/
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # engines/: the lab package, also when loaded by path
from lab import findings as common  # noqa: E402
from lab.command_line import (  # noqa: E402 (after the path)
    Command,
    at_least,
    dispatch,
    mode_commands,
    row_lines,
    saved_lines,
)

BLOCK = 32
SCRIPT = "engines/vllm/run.sh"
MODES = {
    "text": "tiny-llama-hf, text",
    "vl": "tiny-qwen2-vl-hf, images",
    "vl-patched": "negative control: tiny-qwen2-vl-hf, block hashes patched to ignore images",
}
COLUMNS = (
    "engine, version", "mode", "requests", "efficiency vs oracle", "vs block-rounded oracle",
    "worst diff", "failures (shrunk counterexamples)",
)  # fmt: skip
MATRIX_COLUMNS = (
    "engine, version", "combination", "flags", "verdict", "requests", "efficiency vs oracle",
    "vs block reference", "worst diff", "claims disagreements", "concurrency",
    "other failures (shrunk counterexamples)",
)  # fmt: skip


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
    r["block_size"] = BLOCK
    r["records"] = len(suite.get("records", []))
    return r


def table(reports: Path, corpus_link: str = "fixtures/corpus/third_party") -> str:
    lines: list[str] = []
    rows = [json.loads(p.read_text()) for p in sorted(reports.glob("vllm-*/row.json"))]
    order = list(MODES)
    for r in sorted(rows, key=lambda r: order.index(r["mode"]) if r["mode"] in order else 9):
        head = f"| {r['engine']} {r['version']} | {MODES.get(r['mode'], r['mode'])} |"
        if not r["suite_ran"]:
            lines.append(f"{head} the suite did not run | | | | |")
            continue
        lines.append(
            f"{head} {r['requests']} ({r['cache_hits']} hits) | "
            f"{common.share(r['reused_tokens'], r['oracle_tokens'])} | "
            f"{common.share(r['block_reused'], r['block_oracle_tokens'])} "
            f"(blocks of {r.get('block_size') or BLOCK}) | {r['worst_diff']:g} | "
            f"{common._failures(r, corpus_link)} |"
        )
    return common.markdown(COLUMNS, lines)


ENGINE = "vllm-cpu"
MATRIX_SCRIPT = "engines/vllm/run.sh matrix"


def combination_mode(name: str) -> str:
    """A combination's mode (the key of its findings): ``vllm-text[b32,c48]`` is
    ``text,b32,c48``."""
    base, _, labels = name.partition("[")
    return ",".join(x for x in (base.removeprefix("vllm-"), labels.rstrip("]")) if x)


def matrix_rows(run: Path, matrix: Path, version: str) -> list[dict[str, Any]]:
    """One row per combination folder of ``run`` that has a ``suite.json``, written to its
    ``row.json``, with the combination's flags and place in ``matrix``."""
    targets = common.matrix_targets(matrix)
    rows = []
    for path in sorted(run.glob("*/suite.json")):
        suite = json.loads(path.read_text())
        for config in suite.get("configs") or [dict(suite, name="")]:
            order, target = targets.get(config["name"], (len(targets), None))
            mode = combination_mode(config["name"])
            r = common.suite_row(config, path.parent, ENGINE, version, mode, {})
            # the declared block reference (the block size in force, reply blocks included)
            r["block_reused"], r["block_oracle_tokens"] = (
                (config["block_reused"], config["block_tokens"])
                if config.get("block_size")
                else block_oracle(suite)
            )
            r["block_size"] = config.get("block_size") or BLOCK
            flags = "" if target is None else shlex.join(target.flags or ())
            concurrency = 1 if target is None else int(target.args.get("concurrency", 1))
            r.update(order=order, name=config["name"], flags=flags, concurrency=concurrency)
            r.update(verdict=config.get("verdict"), not_checked=config.get("not_checked"))
            r["concurrent"] = (config.get("coverage") or {}).get("concurrent")
            (path.parent / "row.json").write_text(json.dumps(r, indent=1) + "\n")
            rows.append(r)
    return rows


def _claims_cell(r: dict[str, Any], corpus_link: str) -> str:
    if r["concurrency"] > 1:
        return "off (waves)"
    text = common.failure_entries(r, corpus_link, lambda f: f["check"] == "claims")
    return text or "none (4 sources agree)"


def _waves_cell(r: dict[str, Any]) -> str:
    if r["concurrency"] <= 1:
        return "one at a time"
    seen = r.get("concurrent") or {}
    judged = sum(v for k, v in seen.items() if isinstance(v, int)) if seen else 0
    return f"{r['concurrency']} in flight; {judged} requests judged in waves"


def matrix_table(*runs: Path, corpus_link: str = "fixtures/corpus/third_party") -> str:
    """The Markdown table of the rows of one or more matrix runs, in the matrix file's order; a
    combination that an earlier run (in argument order) already has is marked as a re-run."""
    lines: list[str] = []
    rows, seen = [], set()
    for i, run in enumerate(runs):
        for path in sorted(run.glob("*/row.json")):
            r = json.loads(path.read_text())
            rows.append((r["order"], i, r["name"] in seen, r))
            seen.add(r["name"])
    for _, _, again, r in sorted(rows, key=lambda x: (x[0], x[3]["name"], x[1])):
        flags = f"`{r['flags']}`" if r["flags"] else "no flags"
        name = f"`{r['name']}`" + (" (re-run)" if again else "")
        head = f"| {r['engine']} {r['version']} | {name} | {flags} |"
        if not r["suite_ran"]:
            why = common._short(str(r.get("engine_error") or "the suite did not run"))
            lines.append(f"{head} ERROR | {why} | | | | | | |")
            continue
        other = common._failures(r, corpus_link, lambda check: check == "claims")
        lines.append(
            f"{head} {str(r.get('verdict') or '').upper()} | {r['requests']} "
            f"({r['cache_hits']} hits) | {common.share(r['reused_tokens'], r['oracle_tokens'])} | "
            f"{common.share(r['block_reused'], r['block_oracle_tokens'])} "
            f"(blocks of {r['block_size']}) | {r['worst_diff']:g} | "
            f"{_claims_cell(r, corpus_link)} | {_waves_cell(r)} | {other} |"
        )
    return common.markdown(MATRIX_COLUMNS, lines)


#: What ``matrix-json`` prints of each row.
FIGURES = (
    "name", "flags", "verdict", "requests", "cache_hits", "reused_tokens", "oracle_tokens",
    "block_reused", "block_oracle_tokens", "block_size", "worst_diff", "failures_by_check",
    "concurrency", "concurrent",
)  # fmt: skip


def _matrix_json(runs: list[str]) -> list[str]:
    out = [
        {"run": run.name, **{k: r.get(k) for k in FIGURES}}
        for run in map(Path, runs)
        for r in (json.loads(p.read_text()) for p in sorted(run.glob("*/row.json")))
    ]
    return [json.dumps(out, indent=1)]


def main(argv: list[str]) -> int:
    def save_matrix(a: list[str]) -> Iterator[str]:
        corpus = Path(a[1])
        return saved_lines(corpus, common.save(Path(a[0]), corpus, "*/row.json", MATRIX_SCRIPT))

    commands = {
        "matrix": Command(
            {3},
            lambda a: row_lines(
                matrix_rows(Path(a[0]), Path(a[1]), a[2]),
                ("name", "verdict", "requests", "efficiency"),
            ),
        ),
        "matrix-json": Command(at_least(1), _matrix_json),
        "matrix-table": Command(at_least(1), lambda a: [matrix_table(*map(Path, a))]),
        "save-matrix": Command({2}, save_matrix),
        **mode_commands(
            row=row,
            table=table,
            prefix="vllm",
            findings=[m for m in MODES if not m.endswith("-patched")],  # not the negative control
            script=SCRIPT,
        ),
    }
    return dispatch(argv, commands, __doc__ or "")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
