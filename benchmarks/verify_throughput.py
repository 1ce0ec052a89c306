"""Throughput of ``pytest --prefixcache-verify`` on the reference engine, optionally profiled.

    python benchmarks/verify_throughput.py [--seed 1] [--json PATH]
    python benchmarks/verify_throughput.py --profile benchmarks/results/verify_profile.txt
    python benchmarks/verify_throughput.py --audit-cost 2 --json benchmarks/results/audit_cost.json
    python benchmarks/verify_throughput.py --cost 1 --json benchmarks/results/verify_cost.json
    python benchmarks/verify_throughput.py --markdown benchmarks/results/verify_cost.json
    python benchmarks/verify_throughput.py --path presets:reference_server --examples 10 \
        --profile benchmarks/results/verify_profile_http.txt
    python benchmarks/verify_throughput.py --parallel 4 --targets reference_server,vllm_cpu \
        --streams 16 --rounds 3 --json benchmarks/results/verify_throughput.json

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

``--cost N`` measures what verification costs on each path to the same engine: N rounds, each
running the same seed back to back in-process (the default engine), through
``presets:reference_server`` and through ``--prefixcache-server-cmd`` (the reference server's
command, with the ``prefixcache`` reply extension and the namespace header). Each run loads
``benchmarks/engine_clock.py``, which adds up the time inside the engine's ``run`` (the server's
``Server-Timing`` header over HTTP) and loads the same modules on every path, so the three draw
the same streams (the JSON says whether they did). ``--markdown FILE`` prints the README table.

``--parallel N`` compares today's sequential stream path with N parallel streams
(``--prefixcache-parallel-streams=N``) on each of ``--targets`` (``reference_server``,
``mlx_lm_server``, ``vllm_cpu``): the same ``--streams`` streams on one engine, ``--warmup``
rounds not counted, then ``--rounds`` rounds of both paths interleaved, requests per second
side by side (:mod:`parallel_streams`).
"""

from __future__ import annotations

import argparse
import hashlib
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


def measure(
    seed: int,
    profile: Path | None = None,
    audit: bool = True,
    path: str | None = None,
    examples: int | None = None,
) -> dict[str, object]:
    """Run the suite once; return wall time, streams, requests and their rates (``path``: one
    of :data:`PATHS`, timed by the engine clock unless profiled)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory(prefix="prefixcache-verify-") as tmp:
        report_path = Path(tmp) / "report.json"
        args = pytest_args(report_path, seed)
        clock = Path(tmp) / "clock.json"
        if examples is not None:
            args.append(f"--prefixcache-examples={examples}")
        if path is not None and profile is not None:  # in this process, not clocked
            args += PATHS[path][0]
            os.environ.update(PATHS[path][1])
        elif path is not None:
            extra_args, extra_env = PATHS[path]
            args += ["-p", "engine_clock", *extra_args]
            pythonpath = os.pathsep.join([str(ROOT / "benchmarks"), env.get("PYTHONPATH", "")])
            env.update(extra_env, PYTHONPATH=pythonpath, PREFIXCACHE_ENGINE_CLOCK=str(clock))
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
        clocked = json.loads(clock.read_text()) if clock.is_file() else None
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
        **({} if clocked is None else _cost_figures(report, clocked, wall)),
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


#: The reference server's command line for ``--prefixcache-server-cmd``.
SERVER_CMD = "{python} -m reference_engine.server --host 127.0.0.1 --port {port}"
#: The paths ``--cost`` compares: pytest arguments and environment for each.
PATHS: dict[str, tuple[list[str], dict[str, str]]] = {
    "in-process": ([], {}),
    "presets:reference_server": (
        ["--prefixcache-engine=pytest_prefixcache.adapters.presets:reference_server"],
        {},
    ),
    "--prefixcache-server-cmd": (
        [f"--prefixcache-server-cmd={SERVER_CMD}"],
        {"PREFIXCACHE_EXTENSIONS": "1", "PREFIXCACHE_NAMESPACE_HEADER": "x-prefixcache-namespace"},
    ),
}


def _cost_figures(
    report: dict[str, Any], clocked: dict[str, float], wall: float
) -> dict[str, object]:
    """The engine's share of the wall time, and a fingerprint of the streams run."""
    shape = [
        (r["stream"], r["request"], r["prompt_tokens"], r["reusable"], r["images"])
        for r in report["records"]
    ]
    return {
        "engine_s": clocked["engine_s"],
        "engine_share": clocked["engine_s"] / wall,
        "engine_calls": clocked["in_process_runs"] + clocked["server_timed_replies"],
        "streams_sha256": hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:16],
    }


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def cost(seed: int, rounds: int) -> dict[str, object]:
    """``rounds`` rounds of the three paths back to back (the order rotates per round; each
    run's ratio is to the in-process run of its round)."""
    names = list(PATHS)
    runs: list[dict[str, object]] = []
    for r in range(rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            before = _uptime()
            run = measure(seed, path=name)
            runs.append({"path": name, "round": r, "uptime_before": before, **run})
            runs[-1]["uptime_after"] = _uptime()
            print(f"{name}: {run['requests']} requests in {run['wall_s']:.1f} s", flush=True)
    inproc = [float(x["wall_s"]) for x in runs if x["path"] == "in-process"]  # type: ignore[arg-type]
    for x in runs:
        x["ratio_to_in_process"] = float(x["wall_s"]) / inproc[int(x["round"])]  # type: ignore[arg-type]
    return {"seed": seed, "rounds": rounds, "server_cmd": SERVER_CMD, "runs": runs}


def markdown(figures: dict[str, Any]) -> str:
    """The README's "What verification costs" table from a ``--cost`` JSON file."""
    same = len({x["streams_sha256"] for x in figures["runs"]}) == 1
    lines = [
        f"| path (seed {figures['seed']}) | requests (streams) | audited on fresh instances "
        "| verdict | wall time | requests/s | engine time (share of wall) | wall / in-process |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    order = list(PATHS)
    runs = sorted(figures["runs"], key=lambda x: (order.index(x["path"]), x["round"]))
    for x in runs:
        name = f"`{x['path']}`" if x["path"] != "in-process" else "in-process (default engine)"
        if figures["rounds"] > 1:
            name += f", round {x['round'] + 1}"
        lines.append(
            f"| {name} | {x['requests']} ({x['streams']}) | {x['audited']} "
            f"| {str(x['verdict']).upper()} "
            f"| {x['wall_s']:.1f} s | {x['requests_per_s']:.1f} "
            f"| {x['engine_s']:.1f} s ({100 * x['engine_share']:.0f}%) "
            f"| {x['ratio_to_in_process']:.2f}x |"
        )
    lines.append("")
    lines.append("(the same streams on every path)" if same else "(the paths drew other streams)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1, help="--prefixcache-seed (default 1)")
    ap.add_argument("--json", type=Path, help="Write the figures to this JSON file")
    ap.add_argument("--profile", type=Path, help="Profile with pyinstrument into this text file")
    ap.add_argument("--audit-cost", type=int, metavar="N", help="N pairs: audited vs unaudited")
    ap.add_argument("--cost", type=int, metavar="N", help="N rounds of the three paths")
    ap.add_argument("--path", choices=list(PATHS), help="One run (or profile) on this path")
    ap.add_argument("--examples", type=int, metavar="N", help="--prefixcache-examples of one run")
    ap.add_argument("--markdown", type=Path, help="Print the table of a --cost JSON file")
    ap.add_argument("--parallel", type=int, metavar="N", help="Sequential vs N parallel streams")
    ap.add_argument("--targets", default="reference_server", help="With --parallel: engines")
    ap.add_argument("--streams", type=int, default=16, help="With --parallel: streams drawn")
    ap.add_argument("--rounds", type=int, default=2, help="With --parallel: rounds of both")
    ap.add_argument("--timeout", type=float, default=120.0, help="With --parallel: per call")
    ap.add_argument("--warmup", type=int, default=1, help="With --parallel: rounds not counted")
    args = ap.parse_args(argv)
    if args.markdown:
        try:
            data = json.loads(args.markdown.read_text())
            if "parallel" in data:  # a --parallel run
                from parallel_streams import markdown as parallel_markdown

                print(parallel_markdown(data))
                return 0
            print(markdown(data))
        except OSError as exc:
            ap.error(f"--markdown {args.markdown}: cannot read it: {exc.strerror}")
        except (ValueError, KeyError, TypeError) as exc:
            ap.error(f"--markdown {args.markdown}: not the JSON of a --cost run ({exc!r})")
        return 0
    if args.parallel:
        from parallel_streams import compare

        targets: list[dict[str, Any]] = []
        for t in args.targets.split(","):
            try:
                targets.append(
                    compare(
                        t, lanes=args.parallel, streams=args.streams, rounds=args.rounds,
                        seed_value=args.seed, timeout=args.timeout, warmup=args.warmup,
                    )
                )  # fmt: skip
            except Exception as exc:  # one engine that does not start leaves the others
                targets.append({"target": t, "error": f"{type(exc).__name__}: {exc}"})
                print(f"{t}: {type(exc).__name__}: {exc}", flush=True)
        figures = {
            "command": "python benchmarks/verify_throughput.py " + " ".join(sys.argv[1:]),
            "seed": args.seed,
            "parallel": args.parallel,
            "streams": args.streams,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "cpus": os.cpu_count(),
            "targets": targets,
        }
    elif args.cost:
        figures = cost(args.seed, args.cost)
    elif args.audit_cost:
        figures = audit_cost(args.seed, args.audit_cost)
    else:
        figures = measure(args.seed, args.profile, path=args.path, examples=args.examples)
    for k, v in figures.items():
        print(f"{k:>16}: {v:.3f}" if isinstance(v, float) else f"{k:>16}: {v}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
