"""What compiling the hybrid's recurrent decoder layers buys, per prefill piece and per decode step.

    python benchmarks/compiled_layers.py [--repeats N] [--json PATH]

The engine's forward (``LoadedModel.forward``) on the tiny-qwen3.5-vl fixture, cut into pieces
of T positions as the engine cuts a prompt at its boundaries (256 positions in all, pieces of
1, 2, 4, 8, 16, 32, 64 and 256), and the decode step (one position), with
``reference_engine.compiled_layers`` on (the engine's default) and off (mlx-vlm's calls, one MLX
operation at a time), interleaved in one process; process CPU time (the MLX stream thread
included), the median of ``--repeats`` rounds per setting, per piece. Each round also checks
that both settings leave bit-identical logits and states. MLX compiles a fused kernel with the
system's C++ compiler the first time it meets it and keeps it under the temp directory: a
warm-up round runs first, so the medians leave that one-time cost out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

PIECES = (1, 2, 4, 8, 16, 32, 64, 256)
POSITIONS = 256


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")

    import numpy as np

    from pytest_prefixcache.package_data import fixture_model
    from reference_engine.model import cache_arrays, load_model

    model = load_model(fixture_model("tiny-qwen3.5-vl"))
    ids = [int(t) for t in np.random.RandomState(0).randint(0, 400, size=POSITIONS + 1)]
    embeds = model.embed(ids)
    positions, _ = model.positions(ids, [])

    def prefill(piece: int) -> tuple[float, list[np.ndarray]]:
        cache = model.make_cache(POSITIONS + 1)
        cuts = list(range(piece, POSITIONS, piece))
        start = time.process_time()
        logits = model.forward(ids[:POSITIONS], embeds[:POSITIONS], cache, positions, cuts=cuts)
        seconds = time.process_time() - start
        return seconds, [np.array(a) for a in (logits, *cache_arrays(cache))]

    def decode() -> tuple[float, list[np.ndarray]]:
        cache = model.make_cache(POSITIONS + 1)
        model.forward(ids[:8], embeds[:8], cache, positions[:, :, :8])
        start = time.process_time()
        for p in range(8, 40):
            logits = model.forward([ids[p]], embeds[p : p + 1], cache, positions[:, :, p : p + 1])
        seconds = (time.process_time() - start) / 32
        return seconds, [np.array(a) for a in (logits, *cache_arrays(cache))]

    def measure(fn: Any) -> dict[str, Any]:
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.repeats + 1):  # the first round warms the traces and kernels up
            seen = {}
            for on in (True, False) if r % 2 else (False, True):
                model.compile_layers = on
                seconds, arrays = fn()
                seen[on] = arrays
                if r:
                    times[on].append(seconds)
            if not all(np.array_equal(a, b) for a, b in zip(seen[True], seen[False])):
                raise SystemExit("compiled and uncompiled layers disagree: not bit-identical")
        on, off = (statistics.median(times[k]) * 1000 for k in (True, False))
        return {"compiled_ms": round(on, 3), "uncompiled_ms": round(off, 3),
                "ratio": round(on / off, 3), "bit_identical": True}  # fmt: skip

    rows = []
    for piece in PIECES:
        row = {"what": f"prefill of {POSITIONS} positions in pieces of {piece}", "piece": piece,
               **measure(lambda piece=piece: prefill(piece))}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    row = {"what": "decode step (ms per step)", "piece": 0, **measure(decode)}
    rows.append(row)
    print(json.dumps(row), flush=True)
    if args.json:
        command = ["python", "benchmarks/compiled_layers.py", *(argv or sys.argv[1:])]
        out = {"repeats": args.repeats, "load": [round(x, 2) for x in os.getloadavg()],
               "command": " ".join(command), "rows": rows}  # fmt: skip
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
