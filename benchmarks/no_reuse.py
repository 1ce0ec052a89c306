"""What the cache costs a request with nothing to reuse: cached from an empty cache vs uncached.

    python benchmarks/no_reuse.py                       # tiny fixture, 30 pairs per request
    python benchmarks/no_reuse.py --size large --pairs 5

The first request of each workload (``workloads.py``) has nothing to reuse; served with the
cache on, it still hashes its blocks, looks them up and stores them. Each pair runs it
uncached (``use_cache=False``) and cached from an empty cache (``reset()``, then
``use_cache=True``), in alternating order; prints the medians and their ratio, the median and
quartiles of the paired differences (cached - uncached of the same pair: robust to the
machine's speed drifting between pairs; the target "never slower than uncached" is a median
at or below zero), and the cached run's steps outside the forward pass (render, key hashing
before the prefill, lookup, store, compaction; the engine stores while MLX computes the
last chunk, so store includes waiting for it). With --json PATH, writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import model_path, warm_up
from workloads import workloads

STEPS = ("render", "keys", "lookup", "store")


def steps_timer(engine: Any) -> tuple[dict[str, float], list[bool]]:
    """Wrap the engine's non-forward steps to sum their wall time while the switch is on."""
    seconds: dict[str, float] = defaultdict(float)
    on = [False]
    owners = [(engine, s, s) for s in STEPS]
    if hasattr(engine, "segments"):  # engines before segments (run from an older checkout)
        owners.append((engine.segments, "compact", "compact"))
    for owner, name, label in owners:
        fn = getattr(owner, name)

        def timed(*a: Any, _fn: Any = fn, _label: str = label, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                if on[0]:
                    seconds[_label] += time.perf_counter() - t0

        setattr(owner, name, timed)
    return seconds, on


def measure(engine: Any, request: Any, pairs: int) -> dict[str, Any]:
    seconds, on = steps_timer(engine)
    cold, cached, diffs = [], [], []
    for i in range(pairs):
        order = ("cold", "cached") if i % 2 == 0 else ("cached", "cold")
        got: dict[str, float] = {}
        for kind in order:
            engine.reset()
            on[0] = kind == "cached"
            t0 = time.perf_counter()
            out = engine.run(request, use_cache=kind == "cached")
            got[kind] = time.perf_counter() - t0
            on[0] = False
        cold.append(got["cold"])
        cached.append(got["cached"])
        diffs.append(got["cached"] - got["cold"])
    return {
        "prompt_tokens": out.prompt_tokens,
        "pairs": pairs,
        "cold_s": statistics.median(cold),
        "cached_s": statistics.median(cached),
        "cached_over_cold": statistics.median(cached) / statistics.median(cold),
        "paired_diff_quartiles_s": statistics.quantiles(diffs, n=4),
        "steps_s": {k: v / pairs for k, v in seconds.items()},
    }


def markdown(paths: list[Path]) -> str:
    """The README's table of the figures in ``paths`` (files this script wrote)."""
    lines = [
        "| size | engine | workload | prompt tokens | uncached | cached | cached / uncached "
        "| cached - uncached, paired: median (quartiles) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for path in paths:
        figures = json.loads(path.read_text())
        engine = figures.get("engine_commit", "current")
        for name, row in figures["requests"].items():
            q1, q2, q3 = (x * 1e3 for x in row["paired_diff_quartiles_s"])
            lines.append(
                f"| {figures['size']} | {engine} | {name} | {row['prompt_tokens']:,} "
                f"| {row['cold_s'] * 1e3:,.1f} ms | {row['cached_s'] * 1e3:,.1f} ms "
                f"| {row['cached_over_cold']:.3f} | {q2:+.2f} ms ({q1:+.2f}, {q3:+.2f}) |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", type=Path, nargs="+", help="Print these results' table and exit")
    ap.add_argument("--size", choices=["tiny", "large"], default="tiny")
    ap.add_argument("--pairs", type=int, default=30, help="Runs of each kind (default 30)")
    ap.add_argument("--json", type=Path, help="Write the figures to this JSON file")
    args = ap.parse_args(argv)
    if args.markdown:
        missing = [str(p) for p in args.markdown if not p.is_file()]
        if missing:
            ap.error(f"--markdown: no such file: {', '.join(missing)}")
        print(markdown(args.markdown))
        return 0
    if args.pairs < 2:
        ap.error(f"--pairs must be at least 2, got {args.pairs}")
    import mlx.core as mx

    from reference_engine import Engine

    mx.set_default_device(mx.cpu)
    engine = Engine.from_pretrained(model_path(args.size))
    warm_up(engine, True)
    rows = {}
    for w in workloads(args.size):
        row = measure(engine, w.requests[0], args.pairs)
        rows[w.name] = row
        steps = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in row["steps_s"].items())
        q1, q2, q3 = (x * 1e3 for x in row["paired_diff_quartiles_s"])
        print(
            f"{w.name:>17}: {row['prompt_tokens']:>5} tokens  uncached {row['cold_s'] * 1e3:7.1f}"
            f" ms  cached {row['cached_s'] * 1e3:7.1f} ms  ({row['cached_over_cold']:.3f})"
            f"  cached - uncached, paired: median {q2:+.2f} ms, quartiles {q1:+.2f} {q3:+.2f}"
            f"  [cached run's steps, ms: {steps}]"
        )
    if args.json:
        figures = {"size": args.size, "requests": rows, "command": " ".join(sys.argv)}
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
