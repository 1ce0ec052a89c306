"""A warm text request, step by step: the reference engine against mlx-lm's prompt cache.

    python benchmarks/text_warm.py --size tiny --passes 5
    python benchmarks/text_warm.py --size large --passes 3

Feeds ``workloads.py``'s agentic_loop (text only) to both engines on the same weights, cached
runs only (an uncached run changes neither engine's cache, so ``side_by_side.py``'s cold runs
are left out), the two engines alternating request by request (which goes first alternates
too), caches reset before each pass. For every warm run with a hit it records the wall time
and the process CPU time (all threads; less sensitive than wall time to other jobs on a
shared machine) and where the time goes:

- reference: the ``Engine`` steps, as ``profile_warm.py`` wraps them (``prefill`` is the
  model's forward over the suffix; ``store`` runs inside it, while MLX computes the last
  chunk, and includes waiting for it);
- mlx-lm (``MlxLmEngine.run``, unchanged): ``tokenize`` (the chat template over the whole
  conversation), ``fetch`` (``LRUPromptCache.fetch_nearest_cache``: a deep copy of the
  nearest cache), ``prefill`` (``generate_step``'s chunks: every uncached position but the
  last, timed by its progress callback), ``first token`` (the last position alone, up to the
  sampled token; ``generate_step`` launches the next decode step before waiting for it),
  ``insert`` (``insert_cache``) and ``other`` (the rest: detokenising, the launched decode
  step when something waits for it, Python).

Per pass, the sums over the warm runs with a hit; medians over the passes in the summary.
Writes ``results/text_warm_<size>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_warm import instrument
from side_by_side import RESULTS, model_path, warm_up
from workloads import workloads


def timed_mlx_lm(engine: Any, seconds: dict[str, float]) -> Callable[[], None]:
    """Wrap ``engine``'s tokenizer, cache and ``stream_generate`` to add each step's wall time
    to ``seconds``; returns a function to call after ``engine.reset()`` (a new cache)."""
    import importlib

    gen: Any = importlib.import_module("mlx_lm.generate")  # mlx_lm.generate is also a function

    def wrap(owner: Any, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[label] += time.perf_counter() - t0

        setattr(owner, name, timed)

    original = gen.stream_generate

    def stream_generate(*args: Any, **kwargs: Any) -> Iterator[Any]:
        marks: list[tuple[int, float]] = []
        kwargs["prompt_progress_callback"] = lambda done, total: marks.append(
            (done, time.perf_counter())
        )
        for response in original(*args, **kwargs):
            if len(marks) >= 2:  # the first token is out: split prefill from it
                seconds["prefill"] += marks[-2][1] - marks[0][1]
                seconds["first token"] += marks[-1][1] - marks[-2][1]
                marks.clear()
            yield response

    gen.stream_generate = stream_generate  # the adapter imports it at each call
    wrap(engine, "tokenize", "tokenize")

    def rewrap() -> None:
        wrap(engine.prompt_cache, "fetch_nearest_cache", "fetch")
        wrap(engine.prompt_cache, "insert_cache", "insert")

    rewrap()
    return rewrap


def run(size: str, passes: int) -> dict[str, Any]:
    import mlx.core as mx

    from pytest_prefixcache.adapters.mlx_lm import MlxLmEngine
    from reference_engine import Engine

    mx.set_default_device(mx.cpu)
    path = model_path(size)
    ref, lm = Engine.from_pretrained(path), MlxLmEngine.from_pretrained(path)
    warm_up(ref, True)
    warm_up(lm, False)
    steps: dict[str, dict[str, float]] = {
        "reference": defaultdict(float),
        "mlx-lm": defaultdict(float),
    }
    switch = instrument(ref, steps["reference"])
    rewrap = timed_mlx_lm(lm, steps["mlx-lm"])
    engines: dict[str, Any] = {"reference": ref, "mlx-lm": lm}
    requests = next(w for w in workloads(size) if w.name == "agentic_loop").requests
    per_pass: list[dict[str, Any]] = []
    for p in range(passes):
        for e in engines.values():
            e.reset()
        rewrap()
        for s in steps.values():
            s.clear()
        totals: dict[str, dict[str, Any]] = {
            n: {"wall_s": 0.0, "cpu_s": 0.0, "suffix_tokens": 0} for n in engines
        }
        for i, req in enumerate(requests):
            order = list(engines) if (p + i) % 2 == 0 else list(engines)[::-1]
            for name in order:
                hit = i > 0  # every later request extends the one before
                switch(hit and name == "reference")
                saved = dict(steps[name])
                w0, c0 = time.perf_counter(), time.process_time()
                out = engines[name].run(req, use_cache=True)
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                switch(False)
                if not hit:
                    steps[name].clear()
                    steps[name].update(saved)
                    continue
                t = totals[name]
                t["wall_s"] += wall
                t["cpu_s"] += cpu
                t["suffix_tokens"] += out.prompt_tokens - out.cached_tokens
                t.setdefault("cached_tokens", []).append(out.cached_tokens)
        for name, t in totals.items():
            t["steps_s"] = dict(steps[name])
            t["other_s"] = t["wall_s"] - sum(t["steps_s"].values())
        per_pass.append(totals)
        r, m = totals["reference"], totals["mlx-lm"]
        print(
            f"pass {p}: wall reference {r['wall_s']:.3f} s, mlx-lm {m['wall_s']:.3f} s "
            f"({r['wall_s'] / m['wall_s']:.3f}); cpu {r['cpu_s']:.3f} s, {m['cpu_s']:.3f} s "
            f"({r['cpu_s'] / m['cpu_s']:.3f})",
            flush=True,
        )
    return {"size": size, "passes": per_pass, "summary": summarise(per_pass)}


def summarise(per_pass: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the passes, per engine and step, and the paired ratios."""
    med = statistics.median
    out: dict[str, Any] = {}
    for name in per_pass[0]:
        rows = [p[name] for p in per_pass]
        labels = sorted({k for r in rows for k in r["steps_s"]})
        out[name] = {
            "wall_s": med(r["wall_s"] for r in rows),
            "cpu_s": med(r["cpu_s"] for r in rows),
            "suffix_tokens": rows[0]["suffix_tokens"],
            "cached_tokens": rows[0]["cached_tokens"],
            "steps_s": {k: med(r["steps_s"].get(k, 0.0) for r in rows) for k in labels},
            "other_s": med(r["other_s"] for r in rows),
        }
    pairs = [(p["reference"], p["mlx-lm"]) for p in per_pass]
    out["reference_over_mlx_lm"] = {
        "wall": med(r["wall_s"] / m["wall_s"] for r, m in pairs),
        "cpu": med(r["cpu_s"] / m["cpu_s"] for r, m in pairs),
        "wall_per_pass": [r["wall_s"] / m["wall_s"] for r, m in pairs],
        "cpu_per_pass": [r["cpu_s"] / m["cpu_s"] for r, m in pairs],
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["tiny", "large"], default="tiny")
    ap.add_argument("--passes", type=int, default=5, help="Passes (default 5)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.passes < 1:
        ap.error(f"--passes must be at least 1, got {args.passes}")
    load = os.getloadavg()
    figures = run(args.size, args.passes)
    figures["load_before"], figures["load_after"] = load, os.getloadavg()
    figures["command"] = "python benchmarks/text_warm.py " + " ".join(argv or sys.argv[1:])
    s = figures["summary"]
    for name in ("reference", "mlx-lm"):
        e = s[name]
        print(
            f"{name:>9}: wall {e['wall_s']:.3f} s, cpu {e['cpu_s']:.3f} s over "
            f"{e['suffix_tokens']} suffix tokens"
        )
        for k, v in sorted(e["steps_s"].items(), key=lambda kv: -kv[1]):
            print(f"{k:>22}: {v:8.3f} s  {v / e['wall_s']:6.1%}")
        print(f"{'other':>22}: {e['other_s']:8.3f} s")
    ratio = s["reference_over_mlx_lm"]
    print(
        f"reference / mlx-lm (median of paired passes): wall {ratio['wall']:.3f}, "
        f"cpu {ratio['cpu']:.3f}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"text_warm_{args.size}.json"
    path.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
