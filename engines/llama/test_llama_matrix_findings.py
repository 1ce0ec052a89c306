"""engines/llama/matrix_findings.py: one row per matrix combination run, the table, and the
counterexamples saved for findings but never for the combination with prompt caching off."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from pytest_prefixcache import Message, Request
from pytest_prefixcache.output.streams import save_stream

HERE = Path(__file__).resolve().parent
MATRIX = HERE / "matrix.toml"


@pytest.fixture
def findings() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llama_matrix", HERE / "matrix_findings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_dir(root: Path, name: str, failing: bool, waves: bool) -> Path:
    run = root / f"run-{name}"
    stream = [Request((Message("user", ("describe the image",)),))]
    failures = save_stream(stream, run / ".prefixcache" / "failures" / "abc").parent
    summary = "equivalence: logits differ beyond the tolerance (atol=0.0001, rtol=0)"
    skipped = [] if waves else [f"suite::test_waves[{name}]: no concurrent service"]
    config = {
        "name": name, "requests": 148, "cache_hits": 92, "reused_tokens": 900,
        "oracle_tokens": 1000, "efficiency": 0.9, "worst_diff": 0.064, "verdict": "fail",
        "tolerance": "atol=0.0001, rtol=0 (llama-server ...)", "skipped": skipped,
        "coverage": {"claims": {"no claim sources declared": 3}, "concurrent": {"x": 6}}
        if waves else {"claims": {"no tap: 148": 148}},
        "failures": [{"check": "equivalence", "test": "streams", "summary": summary,
                      "stream_dir": str(failures)}] if failing else [],
    }  # fmt: skip
    (run / "suite.json").write_text(json.dumps({"configs": [config]}))
    return run


def test_rows_name_the_combination_its_flags_and_whether_waves_ran(
    findings: ModuleType, tmp_path: Path
) -> None:
    for name, failing, waves in (
        ("llama[exact,auto,ram,shift,b2048,sim]", True, False),
        ("llama-np[exact,np2,split,cb,prefix]", False, True),
    ):
        findings.rows(tmp_path, run_dir(tmp_path, name, failing, waves), MATRIX, "srv 1.0", "3")
    waves_pass = run_dir(tmp_path, "llama-np[exact,np2,split,cb,prefix]", True, True)
    findings.rows(tmp_path, waves_pass, MATRIX, "srv 1.0", "40", "waves")
    row = json.loads(
        (tmp_path / "matrix-llama-exact-auto-ram-shift-b2048-sim" / "row.json").read_text()
    )
    assert row["flags"] == "--cache-reuse 4" and row["waves"] == "skipped"
    assert row["version"] == "srv 1.0" and row["examples"] == "3"
    lines = findings.table(tmp_path).splitlines()
    assert len(lines) == 5, lines
    assert lines[4].startswith("| `llama-np[exact,np2,split,cb,prefix]` (waves only) | `-np 2` |")
    assert findings.main(["save", str(tmp_path), str(tmp_path / "corpus")]) == 0
    saved = sorted(p.name for p in (tmp_path / "corpus").iterdir())  # a folder per pass
    assert saved == [
        "llama-server-llama-exact-auto-ram-shift-b2048-sim-equivalence",
        "llama-server-llama-np-exact-np2-split-cb-prefix-waves-equivalence",
    ]
    assert (
        "| `--cache-reuse 4` | 3 | 148 (92) | 90.0% (900 of 1,000) | 0.064 (0.0001) |" in lines[2]
    )
    assert "compared (3 sources, no tap) | skipped | equivalence: logits differ" in lines[2]
    assert "`-np 2` | 3 |" in lines[3] and "| off | ran (6 requests in waves) | none |" in lines[3]


def test_the_combination_with_caching_off_is_never_saved_as_a_finding(
    findings: ModuleType, tmp_path: Path
) -> None:
    for name in ("llama[exact,auto,ram,shift,b2048,sim]", "llama-off[off]"):
        findings.rows(tmp_path, run_dir(tmp_path, name, True, False), MATRIX, "srv 1.0")
    assert findings.main(["save", str(tmp_path), str(tmp_path / "corpus")]) == 0
    saved = sorted(p.name for p in (tmp_path / "corpus").iterdir())
    assert saved == ["llama-server-llama-exact-auto-ram-shift-b2048-sim-equivalence"]
    meta = json.loads((tmp_path / "corpus" / saved[0] / "stream.json").read_text())
    assert meta["version"] == "srv 1.0" and "--cache-reuse 4" in meta["description"]
    assert "engines/llama/run.sh matrix" in meta["description"]
