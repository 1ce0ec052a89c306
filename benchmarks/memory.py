"""Memory under pressure: a long request stream under a small ``max_bytes`` keeps RSS flat.

Runs the reference engine on the tiny Qwen2-VL fixture with a block pool far smaller than the
stream's working set (so it evicts all the time), and prints the process RSS, the pool's
resident bytes and its evictions every ``--every`` requests. The stream mixes fresh prompts,
follow-up turns that reuse a cached prefix, and images. Pass: RSS after the warm-up grows by
less than ``--tolerance-mb`` to the end, and resident bytes never exceed ``max_bytes``.

Usage::

    HF_HUB_OFFLINE=1 python benchmarks/memory.py --requests 2000 --max-bytes 2000000
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections.abc import Iterator, Sequence

import numpy as np

from pytest_prefixcache import Image, Message, Request


def rss_mb() -> float:
    """Current resident set size of this process in MiB (peak RSS where /proc is absent)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def stream(n: int, seed: int, words: int) -> Iterator[Request]:
    """``n`` requests: fresh prompts, follow-up turns of the last one, an image every 5th."""
    rng = np.random.default_rng(seed)
    vocab = "red green blue cyan amber slate river stone cloud field north south".split()
    last: tuple[Message, ...] = ()
    for i in range(n):
        text = " ".join(vocab[j] for j in rng.integers(0, len(vocab), size=words))
        parts: tuple[str | Image, ...] = (f"{i}: {text}",)
        if i % 5 == 0:
            px = rng.integers(0, 256, size=(56, 56, 3), dtype=np.uint8)
            parts = (Image(px), *parts)
        if last and i % 3:  # a follow-up turn: the earlier prompt is a cached prefix
            msgs = (*last, Message("assistant", ("ok",)), Message("user", parts))
        else:
            msgs = (Message("user", parts),)
        last = msgs[-3:] if len(msgs) > 3 else msgs
        yield Request(msgs, max_new_tokens=2)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--max-bytes", type=int, default=2_000_000)
    p.add_argument("--words", type=int, default=40)
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--warmup", type=int, default=200, help="requests before the baseline RSS")
    p.add_argument("--tolerance-mb", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    from reference_engine import Engine, default_model_path

    engine = Engine.from_pretrained(default_model_path(), max_bytes=args.max_bytes)
    print(f"max_bytes={args.max_bytes}, {args.requests} requests, RSS in MiB")
    print(f"{'requests':>8} {'rss_mb':>8} {'resident_bytes':>14} {'evictions':>9} {'s':>6}")
    start, baseline, over = time.perf_counter(), None, 0
    samples: list[tuple[int, float]] = []
    for i, req in enumerate(stream(args.requests, args.seed, args.words), 1):
        engine.run(req, use_cache=True)
        st = engine.stats
        over = max(over, st.resident_bytes - args.max_bytes)
        if i == args.warmup:
            baseline = rss_mb()
        if i % args.every == 0 or i == args.requests:
            rss = rss_mb()
            samples.append((i, rss))
            print(
                f"{i:>8} {rss:>8.1f} {st.resident_bytes:>14} {st.evictions:>9} "
                f"{time.perf_counter() - start:>6.1f}",
                flush=True,
            )
    end = samples[-1][1]
    base = baseline if baseline is not None else samples[0][1]
    growth = end - base
    ok = growth < args.tolerance_mb and over <= 0
    print(
        f"RSS {base:.1f} MiB after {args.warmup} requests -> {end:.1f} MiB after "
        f"{args.requests} (growth {growth:+.1f} MiB, tolerance {args.tolerance_mb:g}); "
        f"resident bytes over max_bytes: {max(over, 0)}; {'PASS (flat)' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
