"""Throughput of ``pytest --prefixcache-verify`` on the reference engine, optionally profiled.

    python benchmarks/verify_throughput.py [--seed 1] [--json PATH]
    python benchmarks/verify_throughput.py --profile benchmarks/results/verify_profile.txt
    python benchmarks/verify_throughput.py --audit-cost 2 --json benchmarks/results/audit_cost.json

Runs the default verification suite (the reference engine on the tiny fixture) in a subprocess,
exactly as a user would, with ``--prefixcache-report``; reads the streams (Hypothesis examples
and corpus scenarios, one stream each) and requests from the report and divides them by the
wall time of the whole pytest process (start-up and collection included). With ``--profile``
the same run goes in-process under pyinstrument (``pip install pyinstrument``), engine calls
made inline on the main thread instead of the worker thread (which a sampling profiler of the
main thread would not see), and the profile is written as a call tree and as a flat list of
self time per function. Profiling slows the run down: profile and timing runs are separate.

``--audit-cost N`` measures what the baseline audit costs: N pairs of runs, alternating, of the
same seed: the default (the engine named by its factory, so a fresh instance recomputes the
audit's sample) and the same engine given as an instance (no audit; the run accepts the
partial coverage that follows).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def pytest_args(report: Path, seed: int) -> list[str]:
    return [
        "--prefixcache-verify",
        "--pyargs",
        "pytest_prefixcache.suite",
        f"--prefixcache-report={report}",
        f"--prefixcache-seed={seed}",
        "-p",
        "no:cacheprovider",
        "-q",
    ]


def profiled(args: list[str], out: Path) -> int:
    """Run pytest in-process under pyinstrument, engine calls inline; write the profile."""
    import pytest
    from pyinstrument import Profiler

    from pytest_prefixcache.verify import worker as runner

    def inline(self: runner.EngineWorker, fn: Any, *, timeout: float, what: str) -> Any:
        start = time.perf_counter()
        try:
            return runner.CallResult(value=fn(), seconds=time.perf_counter() - start)
        except BaseException as exc:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            return runner.CallResult(error=exc, traceback=tb, seconds=time.perf_counter() - start)

    runner.EngineWorker.call = inline  # type: ignore[method-assign]
    profiler = Profiler(interval=0.005)
    profiler.start()
    code = int(pytest.main(args))
    profiler.stop()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        "# self time per function (flat)\n"
        + profiler.output_text(flat=True, flat_time="self")
        + "\n# call tree\n"
        + profiler.output_text()
    )
    return code


#: A module that names the default engine as an instance: no fresh instance, no audit.
INSTANCE_MODULE = "import reference_engine\n\nengine = reference_engine.default_engine()\n"


def measure(seed: int, profile: Path | None = None, audit: bool = True) -> dict[str, object]:
    """Run the suite once; return wall time, streams, requests and their rates."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory(prefix="prefixcache-verify-") as tmp:
        report_path = Path(tmp) / "report.json"
        args = pytest_args(report_path, seed)
        if not audit:
            (Path(tmp) / "engine_instance.py").write_text(INSTANCE_MODULE)
            args += ["--prefixcache-engine=engine_instance:engine", "--prefixcache-allow-partial"]
        cmd = [sys.executable, "-m", "pytest", *args]
        t0 = time.perf_counter()
        if profile is None:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
            code, out = proc.returncode, proc.stdout + proc.stderr
        else:
            os.environ["HF_HUB_OFFLINE"] = "1"
            here = os.getcwd()
            target = profile.resolve()  # before the chdir: a relative path names this directory
            os.chdir(tmp)
            try:
                code, out = profiled(args, target), ""
            finally:
                os.chdir(here)
        wall = time.perf_counter() - t0
        if not report_path.is_file():
            sys.stderr.write(out[-4000:])
            raise SystemExit(f"pytest wrote no report (exit {code})")
        report = json.loads(report_path.read_text())
    tail = [ln for ln in out.splitlines() if ln.strip() and " in " in ln][-1:]
    return {
        "command": "pytest " + " ".join(args).replace(str(report_path), "REPORT.json"),
        "exit_code": code,
        "summary": tail[0] if tail else "",
        "wall_s": wall,
        "streams": report["streams"],
        "requests": report["requests"],
        "streams_per_s": report["streams"] / wall,
        "requests_per_s": report["requests"] / wall,
        "engine_warm_s": report["warm_seconds"],
        "engine_cold_s": report["cold_seconds"],
        "efficiency": report["efficiency"],
        "failures": report["failures_by_check"],
        "verdict": report.get("verdict"),
        "audited": report.get("coverage", {}).get("cold baseline", {}).get("applied", 0),
        "profiled": profile is not None,
    }


def audit_cost(seed: int, pairs: int) -> dict[str, object]:
    """Alternate audited and unaudited runs of the same streams; wall times side by side."""
    runs: dict[str, list[dict[str, object]]] = {"audited": [], "unaudited": []}
    for _ in range(pairs):
        runs["audited"].append(measure(seed))
        runs["unaudited"].append(measure(seed, audit=False))
    walls = {k: [float(r["wall_s"]) for r in v] for k, v in runs.items()}  # type: ignore[arg-type]
    return {
        "seed": seed,
        "pairs": pairs,
        "audited_wall_s": walls["audited"],
        "unaudited_wall_s": walls["unaudited"],
        "ratio_of_medians": sorted(walls["audited"])[pairs // 2]
        / sorted(walls["unaudited"])[pairs // 2],
        "requests": runs["audited"][0]["requests"],
        "audited_requests": runs["audited"][0]["audited"],
        "verdicts": [r["verdict"] for v in runs.values() for r in v],
        "command": runs["audited"][0]["command"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1, help="--prefixcache-seed (default 1)")
    ap.add_argument("--json", type=Path, help="Write the figures to this JSON file")
    ap.add_argument("--profile", type=Path, help="Profile with pyinstrument into this text file")
    ap.add_argument("--audit-cost", type=int, metavar="N", help="N pairs: audited vs unaudited")
    args = ap.parse_args(argv)
    if args.audit_cost:
        figures = audit_cost(args.seed, args.audit_cost)
    else:
        figures = measure(args.seed, args.profile)
    for k, v in figures.items():
        print(f"{k:>16}: {v:.3f}" if isinstance(v, float) else f"{k:>16}: {v}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
