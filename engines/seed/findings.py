"""The findings of the seed engines' flag combinations, and their table (used by
seed_engines.sh); the row, checks and counterexample helpers are shared with the llama and vLLM
findings modules.

A run of ``engines/seed/run.sh verify ENGINE...`` leaves in ``$SEED_DIR/reports/``: a run
directory ``run-<engines>/`` with ``suite.json`` (the plugin's JSON report of the matrix run of
engines/seed/matrix.toml, one ``configs`` row per combination), ``tap/<slug>.jsonl`` (per
request of a combination, the reuse the API reported and the reuse the logit tap saw) and the
failures' saved streams; per combination, ``<engine>-<labels>/checks.xml`` (JUnit XML of
engines/seed/test_seed_engines.py and test_seed_waves.py) and ``checks.jsonl``.

    python engines/seed/findings.py matrix REPORTS RUN MATRIX ENGINE=VERSION...
                                        writes REPORTS/<engine>-<labels>/row.json per combination
    python engines/seed/findings.py table REPORTS                 prints the Markdown table
    python engines/seed/findings.py save REPORTS CORPUS           copies each failure's shrunk
                                                                   counterexample into CORPUS
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
    row_lines,
    saved_lines,
    table_lines,
)
from lab.findings import (  # noqa: E402 (after the path)
    _failures,
    _prefill,
    _short,
    efficiency,
    failure_entries,
    junit_outcomes,
    markdown,
    matrix_targets,
    mode_flags,
    save,
    suite_row,
)

__all__ = ["row", "save", "table"]

#: The targeted check whose failures are claims disagreements (its own table column).
CLAIMS_TEST = "test_claims_agree_with_the_tap"
COLUMNS = (
    "engine, version", "flags", "requests", "efficiency vs oracle",
    "prefilled, reported / really (tap)", "worst diff", "claims disagreements",
    "per-step misalignments", "other failures",
)  # fmt: skip


def known() -> dict[tuple[str, str, str], str]:
    """The xfail reasons of engines/seed/test_seed_engines.py (the targeted checks) and
    test_seed_waves.py (the saved waves), by (engine, mode, test)."""
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent.parent / "tests"))  # its adapter_support (conftest.py)
    import test_seed_engines
    import test_seed_waves

    return {**test_seed_engines.KNOWN, **test_seed_waves.KNOWN}


def checks(path: Path, engine: str, mode: str) -> dict[str, str]:
    """``junit_outcomes`` against the strict xfails of :func:`known`."""
    reasons = known()
    return junit_outcomes(
        path,
        lambda name: (
            (engine, mode, name) in reasons or (engine, mode, name.split("[")[0]) in reasons
        ),
    )


def row(directory: Path, engine: str, version: str, mode: str) -> dict[str, Any]:
    """A mode's row from its directory's suite.json, tap.jsonl and checks.xml."""
    return common.row(
        directory, engine, version, mode, checks(directory / "checks.xml", engine, mode)
    )


def matrix_rows(
    reports: Path, run: Path, matrix: Path, versions: dict[str, str]
) -> list[dict[str, Any]]:
    """One row per configuration of the matrix run in ``run`` (its suite.json, its tap/
    logs), written to ``reports/<engine>-<labels>/row.json`` with the combination's flags and
    its place in ``matrix``."""
    from pytest_prefixcache.adapters.seed import slug as tap_name

    targets = matrix_targets(matrix)
    suite = json.loads((run / "suite.json").read_text())
    rows = []
    for config in suite.get("configs", []):
        order, target = targets[config["name"]]
        engine = str(target.args["engine"])
        base, _, mode = config["name"].partition("[")
        mode = mode.rstrip("]")
        directory = reports / f"{base}-{mode}"  # base: the engine, or its -waves config
        directory.mkdir(parents=True, exist_ok=True)
        tap = run / "tap" / f"{tap_name(engine, target.flags or ())}.jsonl"
        outcomes = checks(directory / "checks.xml", engine, mode)
        r = suite_row(config, directory, engine, versions[engine], mode, outcomes, tap)
        r.update(order=order, flags=shlex.join(target.flags or ()), config=base)
        r.update(concurrency=int(target.args.get("concurrency", 1)))
        (directory / "row.json").write_text(json.dumps(r, indent=1) + "\n")
        rows.append(r)
    return rows


def _is_claim(f: dict[str, Any]) -> bool:
    return f["check"] == "claims" and "per-step logprobs" not in f["summary"]


def _is_step(f: dict[str, Any]) -> bool:
    return f["check"] == "claims" and "per-step logprobs" in f["summary"]


def _claims(r: dict[str, Any], corpus_link: str) -> str:
    text = failure_entries(r, corpus_link, _is_claim)
    targeted = r["checks"].get(CLAIMS_TEST, "")
    if targeted.startswith(("failed", "xfailed")):
        outcome = targeted.split(":")[0]
        text += ("<br>" if text else "") + f"targeted checks: `{CLAIMS_TEST}` {outcome}"
    checked = r.get("claims_checked") or 0
    return text or f"none ({checked:,} figures checked)"


def _steps(r: dict[str, Any], corpus_link: str) -> str:
    text = failure_entries(r, corpus_link, _is_step)
    if text:
        return text
    if not r.get("steps_aligned"):
        return "n/a: the API returned no per-step logprobs"
    return f"none ({r['steps_aligned']:,} steps aligned)"


def _rows(reports: Path) -> list[dict[str, Any]]:
    rows = [json.loads(p.read_text()) for p in reports.glob("*/row.json")]
    return sorted(
        rows,
        key=lambda r: (
            r["engine"] != "vllm-mlx",
            r.get("concurrency", 1),
            r.get("order", 0),
            r["mode"],
        ),
    )


def table(reports: Path, corpus_link: str = "fixtures/corpus/third_party") -> str:
    lines: list[str] = []
    for r in _rows(reports):
        flags = mode_flags(r["engine"], r["mode"], r.get("flags"))
        if r.get("concurrency", 1) > 1:
            flags += f", waves of up to {r['concurrency']}"
        head = f"| {r['engine']} {r['version']} | {flags} |"
        if not r["suite_ran"]:
            why = r.get("engine_error") or "the suite did not run"
            lines.append(f"{head} {_short(str(why))} | | | | | | |")
            continue
        other = _failures(r, corpus_link, lambda check: check in ("claims", CLAIMS_TEST))
        lines.append(
            f"{head} {r['requests']} ({r['cache_hits']} hits) | {efficiency(r)} | "
            f"{_prefill(r['tap'])} | {r['worst_diff']:g} | {_claims(r, corpus_link)} | "
            f"{_steps(r, corpus_link)} | {other} |"
        )
    return markdown(COLUMNS, lines)


def main(argv: list[str]) -> int:
    def write_rows(a: list[str]) -> Iterator[str]:
        versions = dict(v.split("=", 1) for v in a[3:])
        found = matrix_rows(Path(a[0]), Path(a[1]), Path(a[2]), versions)
        return row_lines(found, ("engine", "mode", "requests", "efficiency"))

    commands = {
        "matrix": Command(at_least(3), write_rows),
        "table": table_lines(table),
        "save": Command({2}, lambda a: saved_lines(Path(a[1]), save(Path(a[0]), Path(a[1])))),
    }
    return dispatch(argv, commands, __doc__ or "")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
