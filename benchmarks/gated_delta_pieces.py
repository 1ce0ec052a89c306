"""Where the sequential gated-delta kernel beats mlx-vlm's chunked scan, per piece length.

    python benchmarks/gated_delta_pieces.py [--repeats N] [--json PATH]

A hybrid prefill cut at segment boundaries runs its GatedDeltaNet layers over pieces of a few
tokens. On CPU mlx-vlm's ``qwen3_5`` runs every multi-token piece through
``gated_delta_chunked`` (a chunked scan padded to 64 positions with a 63-step triangular solve),
whatever its length; ``gated_delta_ops`` (the sequential recurrence, one step per position) is
the other implementation. This times both, side by side in one process, on the tiny-qwen3.5-vl
fixture's shapes (its ``text_config``: heads and head dimensions), for each piece length, and
prints the median milliseconds of each and their ratio. The reference engine's
``reference_engine.recurrent.SEQUENTIAL_UP_TO`` is the longest length where the sequential kernel
was faster here (results/gated_delta_pieces.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

LENGTHS = (1, 2, 4, 8, 16, 32, 48, 64, 65, 96, 128, 129, 192, 256, 384, 512)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    import mlx.core as mx
    from mlx_vlm.models.qwen3_5 import gated_delta as gd

    from pytest_prefixcache.package_data import fixture_model
    from reference_engine.fixtures import QWEN3_5_VL_DIR
    from reference_engine.recurrent import SEQUENTIAL_UP_TO, original_chunked

    mx.set_default_device(mx.cpu)
    text = json.loads((fixture_model(QWEN3_5_VL_DIR) / "config.json").read_text())["text_config"]
    hk, hv = text["linear_num_key_heads"], text["linear_num_value_heads"]
    dk, dv = text["linear_key_head_dim"], text["linear_value_head_dim"]
    chunked, ops = original_chunked(), gd.gated_delta_ops
    rows = []
    for n in LENGTHS:
        mx.random.seed(n)
        q, k = (mx.random.normal((1, n, hk, dk)) for _ in range(2))
        v = mx.random.normal((1, n, hv, dv))
        g = mx.random.uniform(0.5, 1.0, (1, n, hv))
        beta = mx.random.uniform(0.0, 1.0, (1, n, hv))
        state = mx.zeros((1, hv, dv, dk), dtype=mx.float32)
        mx.eval(q, k, v, g, beta, state)
        times: dict[str, list[float]] = {"chunked": [], "sequential": []}
        for _ in range(args.repeats):  # interleaved, so that load hits both alike
            for name, fn in (("chunked", chunked), ("sequential", ops)):
                t0 = time.perf_counter()
                mx.eval(*fn(q, k, v, g, beta, state))
                times[name].append((time.perf_counter() - t0) * 1e3)
        c, s = (statistics.median(times[x]) for x in ("chunked", "sequential"))
        rows.append(
            {
                "length": n,
                "chunked_ms": round(c, 3),
                "sequential_ms": round(s, 3),
                "sequential_over_chunked": round(s / c, 3),
            }
        )
        print(f"{n:4d} tokens: chunked {c:7.3f} ms  sequential {s:7.3f} ms  ratio {s / c:5.2f}")
    faster = [r["length"] for r in rows if r["sequential_over_chunked"] < 1.0]
    print(
        f"sequential faster up to: {max(faster) if faster else 0} tokens "
        f"(lengths where it was: {faster}); the engine uses it up to {SEQUENTIAL_UP_TO}"
    )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "command": " ".join(["python", *sys.argv]),
                    "repeats": args.repeats,
                    "rows": rows,
                    "engine_limit": SEQUENTIAL_UP_TO,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
