"""benchmarks/failing_runs.py: docs/benchmarks.md shows the table its committed JSON renders,
and every mutant's failing run there stayed within twice the passing run's CPU with the
default shrink budget (the JSON is the record; no run here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import failing_runs  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "failing_runs.json"


def test_the_table_in_docs_benchmarks_is_the_committed_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert failing_runs.main(["--markdown", str(RESULTS)]) == 0
    table = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("|")]
    runs = json.loads(RESULTS.read_text())["runs"]
    assert len(table) == 2 + len(runs)
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    assert all(line in doc for line in table)


def test_the_recorded_failing_runs_were_bounded_and_reported_every_failure() -> None:
    runs = {(r["name"], r["budget"]): r for r in json.loads(RESULTS.read_text())["runs"]}
    passing = runs[("pass", "default")]
    for (name, budget), r in runs.items():
        if name == "pass" or budget != "default":
            continue
        assert r["verdict"] == "fail" and r["failures"], name
        assert all(f["replay"] and f["stream_requests"] for f in r["failures"]), name
        assert r["cpu_s"] <= 2 * passing["cpu_s"], name
        # the same failing tests as without the budget
        unbounded = runs[(name, "none")]
        assert [f["test"] for f in r["failures"]] == [f["test"] for f in unbounded["failures"]]


def test_a_bad_results_file_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"seed": 1}')
    for path, says in [(tmp_path / "missing.json", "cannot read it"), (bad, "not the JSON")]:
        with pytest.raises(SystemExit) as info:
            failing_runs.main(["--markdown", str(path)])
        assert info.value.code == 2 and says in capsys.readouterr().err
