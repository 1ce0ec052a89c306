"""vllm-mlx 0.6.0 --continuous-batching --mllm: is the image exchange in a wave the engine's, or
the logit tap's attribution? The saved wave (two requests, the same text, images A and B: the
same prompt length and the same token ids, image pads and all) sent in flight together; each
reply's own generated TEXT (the API's, no tap involved) compared with the text of the same
request served alone, and the tap's logits compared as the waves property compares them.

If the engine answered A with B's pixels, A's text in the wave is B's text alone. If the tap gave
A's reply B's track (which it cannot tell apart by length or ids), the texts agree while the
tap's logits are exchanged.

Run from the checkout, SEED_DIR naming the seed engines, TMPDIR a scratch directory:
    SEED_DIR=<main>/.engines/seed python benchmarks/results/seed_claims/exchange_text.py \
        WAVE_DIR [TRIES [FLAGS...]]
WAVE_DIR: a saved wave of fixtures/corpus/third_party (two requests). Default flags:
``--continuous-batching --mllm --max-num-seqs 2``.
"""

from __future__ import annotations

import dataclasses
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from pytest_prefixcache.adapters.seed import seed_server
from pytest_prefixcache.output.streams import load_stream
from pytest_prefixcache.types import Outcome

FLAGS = ["--continuous-batching", "--mllm", "--max-num-seqs", "2"]
TOKENS = 24  # long enough for A's and B's greedy texts to differ


def diff(x: Outcome, y: Outcome) -> float:
    assert x.logits is not None and y.logits is not None
    return float(np.abs(x.logits - y.logits).max())


def which(cached: Outcome, own: Outcome, other: Outcome, me: str, you: str) -> str:
    """Whose text alone the cached reply's text is."""
    if cached.text == own.text:
        return f"= {me} alone"
    return f"= {you} alone" if cached.text == other.text else f"other: {cached.text!r}"


def main() -> None:
    stream, _ = load_stream(Path(sys.argv[1]))
    tries = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    flags = sys.argv[3:] or FLAGS
    a, b = (dataclasses.replace(r, max_new_tokens=TOKENS) for r in stream[:2])
    with seed_server("vllm-mlx", flags, concurrency=4, audit=False, claims=False) as e:
        ra, rb = e.run(a, use_cache=False), e.run(b, use_cache=False)
        print(f"alone (cold): A {ra.text!r}\nalone (cold): B {rb.text!r}")
        print(f"|logits A - B| alone: {diff(ra, rb):.4g}; texts differ: {ra.text != rb.text}")
        for attempt in range(tries):
            e.reset()
            with ThreadPoolExecutor(2) as pool:
                ca, cb = pool.map(lambda r: e.run(r, use_cache=True), [a, b])
            text = f"A's text {which(ca, ra, rb, 'A', 'B')}, B's text {which(cb, rb, ra, 'B', 'A')}"
            tap = (
                f"tap: A-coldA {diff(ca, ra):.4g} A-coldB {diff(ca, rb):.4g} "
                f"B-coldB {diff(cb, rb):.4g} B-coldA {diff(cb, ra):.4g}"
            )
            print(f"try {attempt}: {text}; {tap}; served {ca.served}, {cb.served}", flush=True)


if __name__ == "__main__":
    main()
