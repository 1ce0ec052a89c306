"""One run of the verification suite in a subprocess, timed, for the benchmarks that measure
what a user's run costs (``readme_figures.py``, ``failing_runs.py``): a scratch directory as
its working and temporary directory, this checkout first on ``PYTHONPATH``, the wall and CPU
seconds of the process and its children, the load average around it and its ``report.json``."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SuiteRun", "suite_run"]

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class SuiteRun:
    proc: subprocess.CompletedProcess[str]
    report: dict[str, Any]
    wall_s: float
    cpu_s: float
    load_before: float
    load_after: float


@contextmanager
def suite_run(
    name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
) -> Iterator[SuiteRun]:
    """``python ARGV --prefixcache-report=...`` in a scratch directory, kept (saved streams
    included) until the block ends; a run that wrote no report ends the benchmark."""
    work = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    try:
        report = work / "report.json"
        full = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(work), **(env or {})}
        full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full.get("PYTHONPATH")]))
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, *argv, f"--prefixcache-report={report}"],
            cwd=work, env=full, capture_output=True, text=True, check=False,
        )  # fmt: skip
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if not report.exists():
            raise SystemExit(f"{name}: no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        yield SuiteRun(
            proc, json.loads(report.read_text()), round(wall, 1), round(cpu, 1),
            round(load, 1), round(os.getloadavg()[0], 1),
        )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
