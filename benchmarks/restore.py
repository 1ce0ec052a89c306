"""Cost of restoring cached blocks into a KV cache: exact-size (the engine before) and preallocated.

    python benchmarks/restore.py [--blocks 350] [--repeats 5]

With the hidden-512 benchmark model's KV shapes (8 layers, 4 KV heads, head dim 64, float32,
16-token blocks): *current* is how the engine restored before commit c1b0bb1:
every layer's blocks concatenated into a buffer of exactly the prefix length, so the first
appended suffix chunk makes mlx-vlm's ``KVCache`` grow, copying the whole prefix again;
*preallocated* concatenates the blocks and the room the suffix needs in one step and sets the
cache offset, so the append writes in place (what ``LoadedModel.restore`` does now). Prints
the median seconds of restore and of the first append of a 51-token suffix.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import mlx.core as mx
from mlx_vlm.models.cache import KVCache

LAYERS, HEADS, DIM, BLOCK, STEP = 8, 4, 64, 16, 256

Blocks = list[list[tuple[mx.array, mx.array]]]


def current(blocks: Blocks, extra: int) -> list[KVCache]:
    cache = [KVCache() for _ in range(LAYERS)]
    for layer, c in enumerate(cache):
        c.state = (
            mx.concatenate([b[layer][0] for b in blocks], axis=2),
            mx.concatenate([b[layer][1] for b in blocks], axis=2),
        )
    return cache


def preallocated(blocks: Blocks, extra: int) -> list[KVCache]:
    cache = [KVCache() for _ in range(LAYERS)]
    n = len(blocks) * BLOCK
    room = -(-(n + extra) // STEP) * STEP - n
    for layer, c in enumerate(cache):
        pad = mx.zeros((1, HEADS, room, DIM))
        c.keys = mx.concatenate([*[b[layer][0] for b in blocks], pad], axis=2)
        c.values = mx.concatenate([*[b[layer][1] for b in blocks], pad], axis=2)
        c.offset = n
    return cache


def measure(
    restore: Callable[[Blocks, int], list[KVCache]],
    blocks: Blocks,
    new: list[tuple[mx.array, mx.array]],
) -> tuple[float, float]:
    t0 = time.perf_counter()
    cache = restore(blocks, new[0][0].shape[2])
    mx.eval([c.keys for c in cache], [c.values for c in cache])
    t1 = time.perf_counter()
    mx.eval([c.update_and_fetch(*new[layer]) for layer, c in enumerate(cache)])
    return t1 - t0, time.perf_counter() - t1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=350, help="Cached blocks (default 350)")
    ap.add_argument("--repeats", type=int, default=5, help="Repeats (default 5)")
    args = ap.parse_args(argv)
    mx.set_default_device(mx.cpu)

    def kv(n: int) -> tuple[mx.array, mx.array]:
        return mx.random.normal((1, HEADS, n, DIM)), mx.random.normal((1, HEADS, n, DIM))

    blocks = [[kv(BLOCK) for _ in range(LAYERS)] for _ in range(args.blocks)]
    new = [kv(51) for _ in range(LAYERS)]
    mx.eval(blocks, new)
    samples: dict[str, list[tuple[float, float]]] = {"current": [], "preallocated": []}
    for _ in range(args.repeats):
        samples["current"].append(measure(current, blocks, new))
        samples["preallocated"].append(measure(preallocated, blocks, new))
    for name, s in samples.items():
        r, a = statistics.median(x[0] for x in s), statistics.median(x[1] for x in s)
        print(f"{name:>12}: restore {r:.4f} s  first append {a:.4f} s  total {r + a:.4f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
