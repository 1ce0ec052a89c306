"""Where each gated-delta kernel is fastest, per piece length: sequential, mlx-vlm's chunked scan
(chunks of 64 or of 8), and the engine's scan.

    python benchmarks/gated_delta_pieces.py [--repeats N] [--json PATH]

A hybrid prefill cut at segment boundaries runs its GatedDeltaNet layers over pieces of a few
tokens. On CPU mlx-vlm's ``qwen3_5`` runs every multi-token piece through
``gated_delta_chunked`` (a chunked scan padded to 64 positions with a 63-step triangular solve),
whatever its length; ``gated_delta_ops`` (the sequential recurrence, one step per position) is
the other implementation, the same chunked scan with chunks of 8 positions a third (the engine
of a325bfe), and ``reference_engine.recurrent.scan`` (the same algorithm with one LAPACK
triangular inverse per chunk, one chunk up to ``ONE_CHUNK_UP_TO`` positions, chunks of
``PIECE_CHUNK`` above) the engine's now. This times the four, interleaved in one process, on
the tiny-qwen3.5-vl fixture's shapes (its ``text_config``: heads and head dimensions; queries
and keys L2-normalised as the model's ``_normalize_qk`` leaves them, so that long pieces stay
finite), for each piece length, and prints the median milliseconds of each and the ratios.
``reference_engine.recurrent.SEQUENTIAL_UP_TO`` is the longest length where the sequential
kernel was faster than the engine's scan here (results/gated_delta_pieces.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

LENGTHS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 48, 64, 65, 96, 128, 129, 192, 256, 384, 512)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    import mlx.core as mx
    from mlx_vlm.models.qwen3_5 import gated_delta as gd

    from pytest_prefixcache.package_data import fixture_model
    from reference_engine.fixtures import QWEN3_5_VL_DIR
    from reference_engine.recurrent import PIECE_CHUNK, SEQUENTIAL_UP_TO, original_chunked, scan

    mx.set_default_device(mx.cpu)
    text = json.loads((fixture_model(QWEN3_5_VL_DIR) / "config.json").read_text())["text_config"]
    hk, hv = text["linear_num_key_heads"], text["linear_num_value_heads"]
    dk, dv = text["linear_key_head_dim"], text["linear_value_head_dim"]
    chunked, ops = original_chunked(), gd.gated_delta_ops
    rows = []
    for n in LENGTHS:
        mx.random.seed(n)
        q, k = (mx.random.normal((1, n, hk, dk)) for _ in range(2))
        q, k = (x / mx.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
        v = mx.random.normal((1, n, hv, dv))
        g = mx.random.uniform(0.5, 1.0, (1, n, hv))
        beta = mx.random.uniform(0.0, 1.0, (1, n, hv))
        state = mx.zeros((1, hv, dv, dk), dtype=mx.float32)
        mx.eval(q, k, v, g, beta, state)
        inputs = (q, k, v, g, beta, state)
        kernels = {
            "chunked": lambda a=inputs: chunked(*a),
            "sequential": lambda a=inputs: ops(*a),
            "chunked_8": lambda a=inputs: chunked(*a, None, 8),
            "scan": lambda a=inputs: scan(*a),
        }
        times: dict[str, list[float]] = {name: [] for name in kernels}
        for _ in range(args.repeats):  # interleaved, so that load hits them alike
            for name, fn in kernels.items():
                t0 = time.perf_counter()
                mx.eval(*fn())
                times[name].append((time.perf_counter() - t0) * 1e3)
        c, s, c8, sc = (statistics.median(times[x]) for x in kernels)
        rows.append(
            {
                "length": n,
                "chunked_ms": round(c, 3),
                "sequential_ms": round(s, 3),
                "chunked_8_ms": round(c8, 3),
                "sequential_over_chunked": round(s / c, 3),
                "sequential_over_chunked_8": round(s / c8, 3),
                "chunked_8_over_chunked": round(c8 / c, 3),
                "scan_ms": round(sc, 3),
                "sequential_over_scan": round(s / sc, 3),
                "scan_over_chunked_8": round(sc / c8, 3),
            }
        )
        print(
            f"{n:4d} tokens: chunked {c:7.3f} ms  sequential {s:7.3f} ms  chunks of 8 "
            f"{c8:7.3f} ms  scan {sc:7.3f} ms  sequential / scan: {s / sc:5.2f}  "
            f"scan / 8: {sc / c8:5.2f}"
        )
    faster = [r["length"] for r in rows if r["sequential_over_scan"] < 1.0]
    print(
        f"sequential faster than the scan at {faster}; the engine uses it up to "
        f"{SEQUENTIAL_UP_TO}, the scan above (chunks of {PIECE_CHUNK})"
    )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "command": " ".join(["python", *sys.argv]),
                    "repeats": args.repeats,
                    "rows": rows,
                    "engine_limit": SEQUENTIAL_UP_TO,
                    "engine_chunk": PIECE_CHUNK,
                    "load": os.getloadavg(),
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
