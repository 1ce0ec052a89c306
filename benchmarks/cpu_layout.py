"""The two CPU-layout products of ``reference_engine/cpu.py``: their time, and bit-identity.

    python benchmarks/cpu_layout.py [--repeats 9]

On MLX's CPU device, times (process CPU seconds, all threads; the minimum over ``--repeats``,
the variants alternating) and compares bit for bit:

- a linear layer as ``nn.Linear`` computes it (``x @ weight.T``, ``mx.addmm`` with a bias)
  against ``cpu.TransposedLinear`` (``x @ weight_t``, the bias added after), at the shapes of
  the large benchmark model's layers (hidden 512, MLP 1,408) for a 140-row chunk;
- ``mx.fast.scaled_dot_product_attention`` with the keys as a KV cache returns them (a slice
  of its buffer) against the same keys as a view of a transposed copy (what the engine's cache
  hands attention on CPU), for 460 queries over 4,460 keys with the tiny fixture's heads
  (4 query heads, 2 KV heads, head size 16) and for 140 over 840 with the large model's.

Writes ``results/cpu_layout.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def race(variants: dict[str, Callable[[], Any]], repeats: int) -> dict[str, Any]:
    import mlx.core as mx
    import numpy as np

    outs = {k: np.array(f()) for k, f in variants.items()}
    first = next(iter(outs.values()))
    best = {k: float("inf") for k in variants}
    for i in range(repeats):
        names = list(variants) if i % 2 == 0 else list(variants)[::-1]
        for k in names:
            c0 = time.process_time()
            mx.eval(variants[k]())
            best[k] = min(best[k], time.process_time() - c0)
    return {
        "cpu_s": best,
        "bit_identical": all(np.array_equal(first, o) for o in outs.values()),
    }


def linear_case(k_in: int, k_out: int, bias: bool) -> dict[str, Callable[[], Any]]:
    """``nn.Linear`` and ``TransposedLinear`` on the same weights, for a 140-row chunk."""
    import mlx.core as mx
    import mlx.nn as nn

    from reference_engine.cpu import TransposedLinear

    linear = nn.Linear(k_in, k_out, bias=bias)
    fast = TransposedLinear(linear)
    x = mx.random.normal((1, 140, k_in))
    mx.eval(linear.parameters(), fast.parameters(), x)
    return {"nn.Linear": lambda: linear(x), "TransposedLinear": lambda: fast(x)}


def attention_case(
    heads: int, kv_heads: int, dim: int, queries: int, keys: int
) -> dict[str, Callable[[], Any]]:
    """Causal attention over keys sliced from a cache buffer, and over a transposed view."""
    import mlx.core as mx

    q = mx.random.normal((1, heads, queries, dim))
    buffer = mx.random.normal((1, kv_heads, keys + 256, dim))
    v = mx.random.normal((1, kv_heads, keys, dim))
    k = buffer[:, :, :keys, :]
    kt = mx.swapaxes(mx.contiguous(mx.swapaxes(k, -1, -2)), -1, -2)
    mx.eval(q, buffer, v, kt)

    def sdpa(keys_: mx.array) -> Callable[[], mx.array]:
        return lambda: mx.fast.scaled_dot_product_attention(
            q, keys_, v, scale=dim**-0.5, mask="causal"
        )

    return {"cache slice": sdpa(k), "transposed view": sdpa(kt)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9, help="Repeats per variant (default 9)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    mx.random.seed(0)
    rows: dict[str, Any] = {}
    for name, (k_in, k_out, bias) in {
        "q_proj 512x512, bias": (512, 512, True),
        "k_proj 512x256, bias": (512, 256, True),
        "gate_proj 512x1408": (512, 1408, False),
        "down_proj 1408x512": (1408, 512, False),
    }.items():
        rows[f"linear {name}, 140 rows"] = race(linear_case(k_in, k_out, bias), args.repeats)
    for name, shape in {
        "tiny heads, 460 x 4,460": (4, 2, 16, 460, 4460),
        "large heads, 140 x 840": (8, 4, 64, 140, 840),
    }.items():
        rows[f"attention {name}"] = race(attention_case(*shape), args.repeats)
    for name, r in rows.items():
        (a, ta), (b, tb) = r["cpu_s"].items()
        print(
            f"{name:>40}: {a} {ta * 1000:7.1f} ms, {b} {tb * 1000:7.1f} ms "
            f"({ta / tb:.2f}x), bit-identical {r['bit_identical']}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "cpu_layout.json"
    figures = {
        "rows": rows,
        "command": "python benchmarks/cpu_layout.py " + " ".join(argv or sys.argv[1:]),
    }
    path.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
