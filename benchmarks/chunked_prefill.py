"""A cold prefill in chunks of 256 positions against one piece: the same logits, and the time.

    python benchmarks/chunked_prefill.py [--tokens 4096] [--chunk 256] [--repeats 3]

Runs ``LoadedModel.forward`` on the tiny fixture over a text prompt of ``--tokens`` token ids
(drawn from a fixed seed) from an empty cache, once in chunks of ``--chunk`` positions (what
the engine does) and once in one piece, alternately. Prints the median seconds of each, their
ratio, and whether the last position's logits are bit-identical.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import mlx.core as mx
import numpy as np

from reference_engine import default_model_path
from reference_engine.model import load_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096, help="Prompt tokens (default 4096)")
    ap.add_argument("--chunk", type=int, default=256, help="Chunk size (default 256)")
    ap.add_argument("--repeats", type=int, default=3, help="Repeats (default 3)")
    args = ap.parse_args(argv)
    mx.set_default_device(mx.cpu)
    model = load_model(default_model_path())
    rng = np.random.default_rng(0)
    ids = [int(t) for t in rng.integers(0, min(model.eos_token_ids), size=args.tokens)]
    positions, _ = model.positions(ids, [])
    embeds = model.embed(ids)
    mx.eval(positions, embeds)
    seconds: dict[str, list[float]] = {"chunked": [], "one piece": []}
    logits: dict[str, np.ndarray] = {}
    for _ in range(args.repeats):
        for name, chunk in (("chunked", args.chunk), ("one piece", args.tokens)):
            t0 = time.perf_counter()
            out = model.forward(ids, embeds, model.make_cache(args.tokens), positions, chunk=chunk)
            seconds[name].append(time.perf_counter() - t0)
            logits[name] = np.array(out)
    chunked, whole = (statistics.median(seconds[k]) for k in ("chunked", "one piece"))
    print(
        f"{args.tokens} tokens, chunks of {args.chunk}: {chunked:.3f} s; one piece: {whole:.3f} s"
    )
    print(f"one piece / chunked: {whole / chunked:.2f}")
    print(f"bit-identical logits: {np.array_equal(logits['chunked'], logits['one piece'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
