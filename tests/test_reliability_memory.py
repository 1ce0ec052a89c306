"""benchmarks/memory.py: a short run under a small max_bytes evicts, stays within the budget
and prints RSS over time (the full run's figure is in the README)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "memory.py"


def test_memory_benchmark_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("mlx.core")
    spec = importlib.util.spec_from_file_location("memory_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["memory_benchmark"] = module
    try:
        spec.loader.exec_module(module)
        code = module.main(
            ["--requests", "60", "--every", "20", "--warmup", "20", "--max-bytes", "300000",
             "--tolerance-mb", "1000"]
        )  # fmt: skip
    finally:
        sys.modules.pop("memory_benchmark", None)
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [20, 40, 60]
    assert all(0 < int(r[2]) <= 300_000 for r in rows)  # resident bytes within the budget
    assert int(rows[-1][3]) > 0  # the small pool evicted
    assert "resident bytes over max_bytes: 0; PASS (flat)" in out
