"""Requests per second of the sequential stream path against parallel streams, interleaved.

Used by ``benchmarks/verify_throughput.py --parallel N`` (see its docstring). For each target
engine: one engine (its servers started once), one list of streams drawn by Hypothesis from
the suite's own ``request_streams`` arguments (fixed seed), then ``rounds`` rounds of the two
paths back to back on the same streams, the order alternating per round:

- sequential: ``Verifier.run`` on each stream, one after the other (today's path);
- parallel: the same streams in groups of N, each group through ``run_parallel`` (lane j's
  namespaces prefixed ``laneJ``, :mod:`pytest_prefixcache.verify.parallel`).

Each path gets a fresh Verifier (report, oracle) and a fresh baseline audit (its own fresh
instances, when the target has them); a failure is recorded and the run goes on with the
next stream (or group). Requests per second = the report's requests / the path's wall time
(engine start-up excluded: both paths use the servers started before the first round).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

from pytest_prefixcache.checks import CacheDesign, Tolerance
from pytest_prefixcache.errors import VerificationFailure
from pytest_prefixcache.output.report import Report
from pytest_prefixcache.session.fixtures import engine_tolerance, load_engine_with_audit
from pytest_prefixcache.strategies import request_streams, stream_kwargs
from pytest_prefixcache.types import Request
from pytest_prefixcache.verify.audit import Audit
from pytest_prefixcache.verify.parallel import lanes_for, run_parallel, separate
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions
from pytest_prefixcache.verify.worker import EngineWorker


def _engines_dir() -> Path:
    """``ENGINES_DIR``, else the main checkout's ``.engines`` (as engines/*/run.sh)."""
    if os.environ.get("ENGINES_DIR"):
        return Path(os.environ["ENGINES_DIR"])
    root = Path(__file__).resolve().parents[1]
    common = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--path-format=absolute", "--git-common-dir"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return (Path(common).parent if common else root) / ".engines"


def _vllm_spec() -> tuple[str, dict[str, str]]:
    here = _engines_dir() / "vllm"
    return "parallel_streams:vllm_text", {
        "PREFIXCACHE_VLLM_PYTHON": str(here / "venv" / "bin" / "python"),
        "PREFIXCACHE_VLLM_MODEL": str(here / "models" / "tiny-llama-hf"),
    }


#: Engines the comparison runs on: name -> (engine spec for load_engine_with_audit, env).
TARGETS: dict[str, Callable[[], tuple[str, dict[str, str]]]] = {
    "reference_server": lambda: (
        "pytest_prefixcache.adapters.presets:reference_server",
        {"PREFIXCACHE_CONCURRENCY": "4"},
    ),
    "reference_server_no_audit": lambda: (
        "parallel_streams:reference_no_audit",
        {"PREFIXCACHE_CONCURRENCY": "4"},
    ),
    "mlx_lm_server": lambda: ("pytest_prefixcache.adapters.presets:mlx_lm_server", {}),
    "vllm_cpu": _vllm_spec,
}


def reference_no_audit() -> Any:
    """The reference server, 4 requests at once, without the baseline audit (what the stream
    path costs without the audit's fresh servers)."""
    from pytest_prefixcache.adapters.presets import reference_server

    engine = reference_server(concurrency=4)
    engine.supports_fresh_instances = False
    return engine


def vllm_text() -> Any:
    """vLLM CPU on the tiny Llama (HF format), 4 requests at once, no baseline audit (a fresh
    vLLM server takes 40-150 s)."""
    from pytest_prefixcache.adapters.presets import vllm_server

    return vllm_server(
        os.environ["PREFIXCACHE_VLLM_MODEL"],
        python=os.environ["PREFIXCACHE_VLLM_PYTHON"],
        audit=False,
        concurrency=4,
    )


def draw_streams(verifier: Verifier, n: int, seed_value: int) -> list[tuple[Request, ...]]:
    """``n`` streams as the suite draws them for this engine (fixed seed)."""
    out: list[tuple[Request, ...]] = []

    @seed(seed_value)
    @settings(
        max_examples=n,
        phases=(Phase.generate,),
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(stream=request_streams(**stream_kwargs(verifier.engine)))
    def collect(stream: tuple[Request, ...]) -> None:
        out.append(stream)

    collect()
    return out[:n]


def _verifier(engine: Any, audit: Audit, timeout: float) -> Verifier:
    options = VerifyOptions(
        design=CacheDesign.of(engine),
        tolerance=engine_tolerance(Tolerance(), engine),
        timeout=timeout,
    )
    fresh = Audit(audit.fresh, audit.missing, audit.share)
    return Verifier(engine, EngineWorker("bench-engine"), options, Report(), audit=fresh)


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run_path(
    engine: Any, audit: Audit, streams: Sequence[tuple[Request, ...]], lanes: int, timeout: float
) -> dict[str, Any]:
    """One path over every stream: wall time, requests, failures (check and first line)."""
    verifier = _verifier(engine, audit, timeout)
    failures: list[str] = []
    before = _uptime()
    start = time.perf_counter()
    units: list[Sequence[tuple[Request, ...]]] = (
        [[s] for s in streams]
        if lanes == 1
        else [streams[i : i + lanes] for i in range(0, len(streams), lanes)]
    )
    for unit in units:
        try:
            if lanes == 1:
                verifier.run(unit[0])
            else:
                run_parallel(verifier, separate(unit))
        except VerificationFailure as exc:
            failures.append(f"{exc.check}: {str(exc).splitlines()[0][:200]}")
            if verifier.dead is not None:
                break
    wall = time.perf_counter() - start
    verifier.audit.close()
    r = verifier.report
    return {
        "lanes": lanes,
        "wall_s": round(wall, 2),
        "streams": r.streams,
        "requests": r.requests,
        "requests_per_s": round(r.requests / wall, 3),
        "cache_hits": r.cache_hits,
        "audited": r.coverage.get("cold baseline", {}).get("applied", 0),
        "failures": failures,
        "uptime_before": before,
        "uptime_after": _uptime(),
    }


def compare(
    target: str,
    *,
    lanes: int,
    streams: int,
    rounds: int,
    seed_value: int,
    timeout: float,
    warmup: int = 1,
) -> dict[str, Any]:
    """Both paths, ``rounds`` times, interleaved, on one engine of ``target``, after
    ``warmup`` rounds that are not counted (a server's first requests are slow: vLLM CPU took
    118 s for the first 41 requests here, 5.4 s for the same ones next); one round when the
    engine gets a single lane (only the sequential path runs)."""
    spec, env = TARGETS[target]()
    os.environ.update(env)
    t0 = time.perf_counter()
    engine, audit = load_engine_with_audit(spec, Path(__file__).resolve().parent)
    started = time.perf_counter() - t0
    try:
        probe = _verifier(engine, audit, timeout)
        drawn = draw_streams(probe, streams, seed_value)
        k, why = lanes_for(engine, lanes)
        out: dict[str, Any] = {
            "target": target,
            "engine": spec,
            "env": {k: Path(v).name if os.sep in v else v for k, v in env.items()},
            "start_s": round(started, 1),
            "lanes_asked": lanes,
            "lanes": k,
            "why_fewer": why,
            "audit": audit.fresh is not None,
            "streams_drawn": len(drawn),
            "requests_drawn": sum(len(s) for s in drawn),
            "rounds": [],
        }
        total = warmup + rounds if k > 1 else 1
        for r in range(total):
            paths = [1, k] if k > 1 else [1]
            if r % 2:
                paths.reverse()
            runs: dict[str, Any] = {"warmup": r < total - rounds} if k > 1 else {}
            for n in paths:
                runs["sequential" if n == 1 else "parallel"] = run_path(
                    engine, audit, drawn, n, timeout
                )
                done = runs["sequential" if n == 1 else "parallel"]
                print(
                    f"{target} round {r + 1}: {'sequential' if n == 1 else f'parallel x{n}'} "
                    f"{done['requests']} requests in {done['wall_s']} s "
                    f"({done['requests_per_s']}/s), failures {len(done['failures'])}",
                    flush=True,
                )
            if "parallel" in runs and runs["sequential"]["requests_per_s"] > 0:
                runs["ratio"] = round(
                    runs["parallel"]["requests_per_s"] / runs["sequential"]["requests_per_s"], 3
                )
            out["rounds"].append(runs)
        counted = [x for x in out["rounds"] if not x.get("warmup")]
        for path in ("sequential", "parallel"):
            rates = sorted(x[path]["requests_per_s"] for x in counted if path in x)
            if rates:
                out[f"{path}_median_requests_per_s"] = rates[len(rates) // 2]
        ratios = sorted(x["ratio"] for x in counted if "ratio" in x)
        if ratios:
            out["median_ratio"] = ratios[len(ratios) // 2]
        return out
    finally:
        close = getattr(engine, "close", None)
        if callable(close):
            close()


def markdown(figures: dict[str, Any]) -> str:
    """The docs/benchmarks.md table of a ``--parallel`` JSON file: one row per counted round."""
    lines = [
        "| engine | round | requests (streams) | audited | sequential | parallel "
        f"x{figures['parallel']} | parallel / sequential | load average before (1 min) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in figures["targets"]:
        if "error" in t:
            lines.append(f"| {t['target']} | | | | {t['error']} | | | |")
            continue
        counted = [x for x in t["rounds"] if not x.get("warmup")]
        for n, x in enumerate(counted, 1):
            seq, par = x["sequential"], x.get("parallel")
            load = seq["uptime_before"].split("load average:")[-1].split(",")[0].strip()
            cells = [
                t["target"],
                str(n),
                f"{seq['requests']} ({seq['streams']})",
                str(seq["audited"]),
                f"{seq['requests_per_s']:.2f} req/s ({seq['wall_s']:.1f} s)",
                "n/a"
                if par is None
                else f"{par['requests_per_s']:.2f} req/s ({par['wall_s']:.1f} s)",
                "n/a" if par is None else f"{x['ratio']:.2f}x",
                load,
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
