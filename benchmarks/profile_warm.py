"""Where a warm run's time goes: per engine step, and a pyinstrument profile.

    python benchmarks/profile_warm.py --size tiny              # every workload, tiny fixture
    python benchmarks/profile_warm.py --size large --workload image_edit
    python benchmarks/profile_warm.py --prefill-pair 5    # prefill.py's two conversations

Feeds the workloads of ``workloads.py`` to the reference engine (cold run, limit, warm run per
request, as ``side_by_side.py`` does) and, over the warm runs that reused something, sums the
seconds spent in each step of ``Engine`` (render and image preparation, keys, lookup, restore,
input embeddings, position ids, prefill, store, decode; MLX evaluates lazily, so a step's
pending work can land in the next one that evaluates: the embeddings in prefill; store runs
inside prefill, while MLX computes the last chunk, and its time includes waiting for that
chunk: it is counted for store, not for prefill) against the
limit (``limits.py``). ``--prefill-pair N`` replaces the workloads by N repeats of
``prefill.py``'s pair (a 5,651-token conversation, then the same with its last image changed).
Writes ``results/warm_steps_<tag>.json``, the tag being the size, ``_prefill`` and each
``_<workload>`` asked for; with ``--pyinstrument``, ``warm_steps_<tag>_pyinstrument.json`` and
the profile of the warm runs, ``results/warm_profile_<tag>.txt`` (the sampler slows the warm
runs a little, so the step times and warm / limit of such a run are not the benchmark's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from limits import limit
from side_by_side import RESULTS, model_path, warm_up
from workloads import Workload, workloads

STEPS = ("render", "keys", "lookup", "restore", "suffix_embeddings", "prefill", "store", "decode")


def instrument(engine: Any, seconds: dict[str, float]) -> Callable[[bool], None]:
    """Wrap the engine's steps (and position ids, image preparation) to add their wall time
    to ``seconds`` while recording is on; returns the switch. A step called inside another
    (store runs inside prefill, while MLX computes the last chunk) counts for itself only:
    the enclosing step's time excludes it."""
    on = [False]
    nested: list[float] = []  # per open step: seconds spent in steps called inside it

    def wrap(owner: Any, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not on[0]:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            nested.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - t0
                inner = nested.pop()
                seconds[label] += elapsed - inner
                if nested:
                    nested[-1] += elapsed

        setattr(owner, name, timed)

    for step in STEPS:
        wrap(engine, step, step)
    wrap(engine.model, "positions", "positions")
    wrap(engine.vision, "prepare", "prepare images")

    def switch(value: bool) -> None:
        on[0] = value

    return switch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["tiny", "large"], default="tiny")
    ap.add_argument("--workload", action="append", help="Only this workload (repeatable)")
    ap.add_argument("--prefill-pair", type=int, default=0, help="Profile prefill.py's pair N times")
    ap.add_argument("--pyinstrument", action="store_true", help="Also profile with pyinstrument")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    import mlx.core as mx

    from reference_engine import Engine

    mx.set_default_device(mx.cpu)
    engine = Engine.from_pretrained(model_path(args.size))
    warm_up(engine, True)
    seconds: dict[str, float] = defaultdict(float)
    switch = instrument(engine, seconds)
    profiler: Any = None
    if args.pyinstrument:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
    totals = {"warm_s": 0.0, "limit_s": 0.0, "requests": 0}
    loads = workloads(args.size)
    if args.prefill_pair:
        from prefill import conversation

        pair = (conversation(8, 1), conversation(8, 2))
        loads = [Workload("prefill_pair", pair, multimodal=True)] * args.prefill_pair
    for w in loads:
        if args.workload and w.name not in args.workload:
            continue
        engine.reset()
        for req in w.requests:
            engine.run(req, use_cache=False)
            lim = limit(engine, req)
            hit = lim.start > 0
            switch(hit)
            if hit and profiler is not None:
                profiler.start()
            t0 = time.perf_counter()
            engine.run(req, use_cache=True)
            warm = time.perf_counter() - t0
            if hit and profiler is not None:
                profiler.stop()
            switch(False)
            if hit:
                totals["warm_s"] += warm
                totals["limit_s"] += lim.limit_s
                totals["requests"] += 1
    accounted = sum(seconds.values())
    out = {
        "size": args.size,
        "workloads": args.workload or [w.name for w in loads],
        **totals,
        "steps_s": dict(seconds),
        "other_s": totals["warm_s"] - accounted,
        "command": "python benchmarks/profile_warm.py " + " ".join(argv or sys.argv[1:]),
    }
    warm_s, limit_s = totals["warm_s"], totals["limit_s"]
    print(
        f"{totals['requests']} warm runs with a hit: warm {warm_s:.3f} s, "
        f"limit {limit_s:.3f} s, ratio {warm_s / limit_s:.2f}"
    )
    for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"{name:>18}: {s:8.3f} s  {s / totals['warm_s']:6.1%}")
    print(f"{'other':>18}: {out['other_s']:8.3f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    tag = args.size + ("_prefill" if args.prefill_pair else "")
    tag += "".join(f"_{name}" for name in args.workload or ())
    # pyinstrument slows the runs a little: its step times are kept apart from a plain run's
    path = args.out / f"warm_steps_{tag}{'_pyinstrument' if profiler else ''}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    if profiler is not None:
        text = profiler.output_text(unicode=False, color=False, show_all=False)
        (args.out / f"warm_profile_{tag}.txt").write_text(text)
        print(f"wrote {args.out / f'warm_profile_{tag}.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
