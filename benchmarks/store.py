"""Cost of copying a request's new KV rows for storing: a copy per block against one segment.

    python benchmarks/store.py [--tokens 2969] [--repeats 20]

With the tiny fixture's KV shapes (read from its config.json; 16-token blocks): *per block* is
how the engine stored before commit ea8e8d0, a copy of each block's rows per layer, keys and
values, evaluated at once; *segment* is ``kv.copy_segment``, what ``KVStore.store`` does now:
one copy per layer, keys and values, with a window per block on it. Prints the arrays copied
and the median seconds of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass

import mlx.core as mx

from reference_engine import default_model_path
from reference_engine.kv import copy_segment

BLOCK = 16


@dataclass
class Layer:
    """A stand-in KVCache layer: its ``keys`` and ``values`` buffers."""

    keys: mx.array
    values: mx.array


def per_block(cache: list[Layer], n: int) -> int:
    copies = [
        [
            (mx.array(c.keys[:, :, s : s + BLOCK]), mx.array(c.values[:, :, s : s + BLOCK]))
            for c in cache
        ]
        for s in range(0, n, BLOCK)
    ]
    mx.eval(copies)
    return 2 * len(cache) * len(copies)


def segment(cache: list[Layer], n: int) -> int:
    copy_segment(cache, 0, n)
    return 2 * len(cache)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2969, help="Rows to store (default 2969)")
    ap.add_argument("--repeats", type=int, default=20, help="Repeats (default 20)")
    args = ap.parse_args(argv)
    mx.set_default_device(mx.cpu)
    config = json.loads((default_model_path() / "config.json").read_text())
    heads, dim = (
        config["num_key_value_heads"],
        config["hidden_size"] // config["num_attention_heads"],
    )
    shape = (1, heads, args.tokens, dim)
    cache = [
        Layer(mx.random.normal(shape), mx.random.normal(shape))
        for _ in range(config["num_hidden_layers"])
    ]
    mx.eval([(c.keys, c.values) for c in cache])
    for name, copy in (("per block", per_block), ("segment", segment)):
        samples, arrays = [], 0
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            arrays = copy(cache, args.tokens)
            samples.append(time.perf_counter() - t0)
        print(f"{name:>9}: {arrays:4} arrays  {statistics.median(samples) * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
