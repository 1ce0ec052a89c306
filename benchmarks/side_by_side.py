"""Reuse and time to first token of the reference engine, mlx-vlm APC and mlx-lm, side by side.

    python benchmarks/side_by_side.py --size tiny --repeats 3     # the tiny fixture
    python benchmarks/side_by_side.py --size large --repeats 1    # random hidden 512, 8 layers

Every workload of ``workloads.py`` is fed, request by request and in order, to every engine
that can serve it (the reference engine: all; mlx-vlm APC in block and exact-snapshot modes:
the multimodal ones; mlx-lm's prompt cache: the text-only one), each engine on the same model
weights. Per request: an uncached run (cold), then a cached run (warm), both timed to the
first token (``max_new_tokens=0``; the peers' adapters always sample one token); the warm
run's cached tokens against the oracle's maximum valid reuse (``ReuseOracle``) and against
that maximum rounded down to the engine's 16-token blocks; for the reference engine also the
physical limit of a prefix cache (``limits.py``: new images encoded and the suffix prefilled
over its prefix KV already in place) and, for comparison only, the suffix prefilled from an
empty cache (suffix-only: not a valid computation, see ``limits.py``); the resident cache bytes
after the request. ``--repeats`` replays each workload (cache reset first) and keeps the
median time per request. The engines are interleaved request by request (all are loaded at
once; each request goes to every engine before the next one, the first engine rotating), so
that load from other jobs on a shared machine falls on every engine alike; beside the wall
times, each run's process CPU time (every thread), and per workload the reference's warm total
over each peer's, pass by pass (``paired``). Writes ``results/side_by_side_<size>.json`` and,
with ``--charts``, PNG charts (``charts.py``).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from limits import limit
from workloads import Workload, photo, workloads

from pytest_prefixcache import Message, Request
from pytest_prefixcache.checks.oracle import ReuseOracle

MODELS = {
    "tiny": "tiny fixture (hidden 64, 2 layers)",
    "large": "random hidden 512, 8 layers, 8 heads, 4 KV heads",
}
RESULTS = Path(__file__).resolve().parent / "results"
BLOCK = 16
LARGE = {
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 1408,
}


def model_path(size: str) -> Path:
    if size == "tiny":
        from reference_engine import default_model_path

        return default_model_path()
    from reference_engine.fixtures import build_qwen2_vl

    tmp = tempfile.mkdtemp(prefix="prefixcache-bench-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # nothing left in the temp dir
    return build_qwen2_vl(Path(tmp), **LARGE)


def engines(path: Path) -> dict[str, tuple[Callable[[], Any], bool]]:
    """name -> (factory, multimodal); a text-only engine serves only text-only workloads."""
    from pytest_prefixcache.adapters.mlx_lm import MlxLmEngine
    from pytest_prefixcache.adapters.mlx_vlm_apc import MlxVlmApcEngine
    from reference_engine import Engine

    return {
        "reference": (lambda: Engine.from_pretrained(path), True),
        "mlx-vlm APC block": (lambda: MlxVlmApcEngine.from_pretrained(path, mode="block"), True),
        "mlx-vlm APC snapshot": (
            lambda: MlxVlmApcEngine.from_pretrained(path, mode="snapshot"),
            True,
        ),
        "mlx-lm prompt cache": (lambda: MlxLmEngine.from_pretrained(path), False),
    }


def resident_bytes(engine: Any) -> int | None:
    if hasattr(engine, "pool"):  # the reference engine
        return int(engine.stats.resident_bytes)
    if hasattr(engine, "manager"):  # mlx-vlm APC: blocks plus exact snapshots
        return int(engine.manager.resident_bytes())
    if hasattr(engine, "prompt_cache"):  # mlx-lm LRUPromptCache
        return int(engine.prompt_cache.nbytes)
    return None


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``fn()``, its wall seconds and the process CPU seconds it took (every thread)."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def measure(
    engine: Any, req: Request, i: int, oracle: ReuseOracle, reference: bool
) -> dict[str, Any]:
    """One request: the uncached run, the limit (reference engine), the cached run; the
    reuse against the oracle (which then learns the request). Times are wall seconds, and
    the process CPU seconds (every thread) beside them."""
    _, cold, cold_cpu = timed(lambda: engine.run(req, use_cache=False))
    lim = limit(engine, req) if reference else None
    out, warm, warm_cpu = timed(lambda: engine.run(req, use_cache=True))
    ids, spans = tuple(out.token_ids), tuple(out.image_spans or ())
    match = oracle.match(req.namespace, ids, spans)
    oracle.add(i, req.namespace, ids, spans)
    return {
        "prompt_tokens": out.prompt_tokens,
        "cached_tokens": out.cached_tokens,
        "oracle_max": match.max_reuse,
        "oracle_block_max": match.max_reuse // BLOCK * BLOCK,
        "cold_s": cold,
        "warm_s": warm,
        "cold_cpu_s": cold_cpu,
        "warm_cpu_s": warm_cpu,
        "limit_s": None if lim is None else lim.limit_s,
        "limit_embed_s": None if lim is None else lim.embed_s,
        "suffix_only_s": None if lim is None else lim.suffix_only_s,
        "limits_reuse_agrees": None if lim is None else lim.start == out.cached_tokens,
        "resident_bytes": resident_bytes(engine),
    }


def interleaved_pass(
    engines: dict[str, tuple[Any, bool]],
    workload: Workload,
    turn: int = 0,
    measure: Callable[..., dict[str, Any]] = measure,
) -> dict[str, list[dict[str, Any]]]:
    """One pass of ``workload`` through every engine (name -> (engine, is the reference)),
    caches reset first, request by request: each request goes to every engine before the
    next one, the engine going first rotating per request (and with ``turn``, per pass), so
    that load from other jobs on the machine falls on every engine alike. ``measure`` times
    one request on one engine (default: this module's ``measure``)."""
    names = list(engines)
    oracles = {n: ReuseOracle() for n in names}
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for engine, _ in engines.values():
        engine.reset()
    for i, req in enumerate(workload.requests):
        k = (i + turn) % len(names)
        for n in names[k:] + names[:k]:
            engine, reference = engines[n]
            rows[n].append(measure(engine, req, i, oracles[n], reference))
    return rows


def one_pass(engine: Any, workload: Workload, reference: bool) -> list[dict[str, Any]]:
    """One pass of ``workload`` through one engine (see ``interleaved_pass``)."""
    return interleaved_pass({"engine": (engine, reference)}, workload)["engine"]


TIMES = (
    "cold_s",
    "warm_s",
    "cold_cpu_s",
    "warm_cpu_s",
    "limit_s",
    "limit_embed_s",
    "suffix_only_s",
)


def median_rows(
    passes: list[list[dict[str, Any]]], times: tuple[str, ...] = TIMES
) -> list[dict[str, Any]]:
    """Per request: the last pass's counts, the median of each of ``times`` over the passes."""
    rows = []
    for per_pass in zip(*passes, strict=True):
        row = dict(per_pass[-1])
        for k in times:
            if row[k] is not None:
                row[k] = statistics.median(p[k] for p in per_pass)
        row["cached_tokens_same_every_pass"] = len({p["cached_tokens"] for p in per_pass}) == 1
        rows.append(row)
    return rows


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("prompt_tokens", "cached_tokens", "oracle_max", "oracle_block_max", *TIMES[:4])
    total = {k: sum(r[k] for r in rows) for k in keys}
    per_request_vs_oracle = [r["cached_tokens"] / r["oracle_max"] for r in rows if r["oracle_max"]]
    out: dict[str, Any] = {
        **total,
        "efficiency": ratio(total["cached_tokens"], total["prompt_tokens"]),
        "vs_oracle": ratio(total["cached_tokens"], total["oracle_max"]),
        "vs_block_oracle": ratio(total["cached_tokens"], total["oracle_block_max"]),
        "min_request_vs_oracle": min(per_request_vs_oracle, default=None),
        "cold_over_warm": ratio(total["cold_s"], total["warm_s"]),
        "warm_slower_than_cold": sum(r["warm_s"] > r["cold_s"] for r in rows),
        "worst_warm_over_cold": max(r["warm_s"] / r["cold_s"] for r in rows),
        "max_resident_bytes": max((r["resident_bytes"] or 0) for r in rows),
    }
    if rows[0]["suffix_only_s"] is not None:
        hits = [r for r in rows if r["cached_tokens"]]
        out["warm_over_suffix"] = ratio(total["warm_s"], sum(r["suffix_only_s"] for r in rows))
        out["warm_over_suffix_hits"] = ratio(
            sum(r["warm_s"] for r in hits), sum(r["suffix_only_s"] for r in hits)
        )
        out["worst_warm_over_suffix"] = max(r["warm_s"] / r["suffix_only_s"] for r in rows)
        out["warm_over_limit"] = ratio(total["warm_s"], sum(r["limit_s"] for r in rows))
        out["warm_over_limit_hits"] = ratio(
            sum(r["warm_s"] for r in hits), sum(r["limit_s"] for r in hits)
        )
        out["worst_warm_over_limit"] = max(r["warm_s"] / r["limit_s"] for r in rows)
    return out


def warm_up(engine: Any, multimodal: bool) -> None:
    """Two uncached runs of a small request: MLX builds its kernels on first use."""
    parts = (photo(0, 64, 64), "warm up") if multimodal else ("warm up",)
    for _ in range(2):
        engine.run(Request((Message("user", parts),)), use_cache=False)


def run(size: str, repeats: int, only: list[str] | None = None) -> dict[str, Any]:
    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    path = model_path(size)
    loads = workloads(size)
    results: dict[str, Any] = {}
    paired: dict[str, Any] = {}
    t_start = time.perf_counter()
    built = {}
    for name, (factory, multimodal) in engines(path).items():
        if not only or name in only:
            built[name] = (factory(), multimodal)
            warm_up(built[name][0], multimodal)
    for w in loads:
        servers = [n for n, (_, mm) in built.items() if mm == w.multimodal or n == "reference"]
        passes: dict[str, list[list[dict[str, Any]]]] = {n: [] for n in servers}
        for turn in range(repeats):
            chosen = {n: (built[n][0], n == "reference") for n in servers}
            for name, rows in interleaved_pass(chosen, w, turn).items():
                passes[name].append(rows)
        paired[w.name] = {
            peer: {
                f"reference_over_peer_{k}_per_pass": [
                    sum(r[k] for r in ours) / sum(r[k] for r in theirs)
                    for ours, theirs in zip(passes["reference"], passes[peer], strict=True)
                ]
                for k in ("warm_s", "warm_cpu_s")
            }
            for peer in servers
            if peer != "reference" and "reference" in passes
        }
        for name in servers:
            rows = median_rows(passes[name])
            results.setdefault(w.name, {})[name] = {"summary": summary(rows), "requests": rows}
            s = results[w.name][name]["summary"]
            print(
                f"{size} {w.name:>17} {name:>21}: reuse {s['efficiency']:.1%}, vs oracle "
                f"{s['vs_oracle'] or 0:.1%} (block {s['vs_block_oracle'] or 0:.1%}), cold/warm "
                f"{s['cold_over_warm']:.2f}x, warm>cold {s['warm_slower_than_cold']}"
                + (
                    f", warm/limit {s['warm_over_limit_hits'] or 0:.2f} (hits), worst "
                    f"{s['worst_warm_over_limit']:.2f}"
                    if "warm_over_suffix" in s
                    else ""
                ),
                flush=True,
            )
    return {
        "size": size,
        "model": MODELS[size],
        "repeats": repeats,
        "block_size": BLOCK,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, MLX CPU",
        "wall_s": time.perf_counter() - t_start,
        "workloads": results,
        "paired": paired,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["tiny", "large"], default="tiny", help="Model and workloads")
    ap.add_argument("--repeats", type=int, default=1, help="Passes per workload (default 1)")
    ap.add_argument("--engine", action="append", help="Only this engine (repeatable)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="Output directory")
    ap.add_argument("--charts", action="store_true", help="Also write PNG charts")
    args = ap.parse_args(argv)
    load = os.getloadavg()
    figures = run(args.size, args.repeats, args.engine)
    figures["load_before"], figures["load_after"] = load, os.getloadavg()  # 1, 5, 15 min
    for name, peers in figures["paired"].items():
        for peer, r in peers.items():
            print(
                f"{name} reference / {peer}, warm per pass: wall "
                + ", ".join(f"{x:.3f}" for x in r["reference_over_peer_warm_s_per_pass"])
                + "; cpu "
                + ", ".join(f"{x:.3f}" for x in r["reference_over_peer_warm_cpu_s_per_pass"])
            )
    figures["command"] = "python benchmarks/side_by_side.py " + " ".join(argv or sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"side_by_side_{args.size}.json"
    path.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {path} ({figures['wall_s']:.0f} s)")
    if args.charts:
        from charts import write_charts

        for png in write_charts(figures, args.out):
            print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
