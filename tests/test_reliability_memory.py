"""benchmarks/memory.py: a short run under a small max_bytes evicts, stays within the budget
and keeps RSS flat after its warm-up (the full run's figure is in docs/benchmarks.md); the same run
with a leak fails."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "memory.py"
# RSS grows by about 20 MiB over the first 60 requests (allocator and caches warming up),
# then by about 3 MiB over the next 60: the baseline is taken after 60. The tolerance is the
# benchmark's default (20 MiB).
ARGS = ["--requests", "120", "--every", "20", "--warmup", "60", "--max-bytes", "300000"]


@pytest.fixture
def benchmark() -> Iterator[ModuleType]:
    pytest.importorskip("mlx.core")
    spec = importlib.util.spec_from_file_location("memory_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["memory_benchmark"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("memory_benchmark", None)


def test_memory_benchmark_smoke(benchmark: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    code = benchmark.main(ARGS)
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [20, 40, 60, 80, 100, 120]
    assert all(0 < int(r[2]) <= 300_000 for r in rows)  # resident bytes within the budget
    assert int(rows[-1][3]) > 0  # the small pool evicted
    assert "(growth +" in out and "tolerance 20)" in out
    assert "resident bytes over max_bytes: 0; PASS (flat)" in out


def test_memory_benchmark_fails_on_a_leak(
    benchmark: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: the same run, with 1 MiB kept alive per request, fails."""
    from reference_engine import Engine

    kept: list[np.ndarray] = []
    run = Engine.run

    def leaky(self: Engine, *args: Any, **kwargs: Any) -> Any:
        kept.append(np.ones(1 << 17))  # 1 MiB, written, so resident
        return run(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "run", leaky)
    code = benchmark.main(ARGS)
    out = capsys.readouterr().out
    assert code == 1, out
    assert "resident bytes over max_bytes: 0; FAIL" in out
