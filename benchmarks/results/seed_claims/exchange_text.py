"""vllm-mlx 0.6.0 --continuous-batching --mllm: is the image exchange in a wave the engine's, or
the logit tap's attribution? A saved wave's requests with the same text and other images of
one size have the same prompt length and the same token ids (image pads and all). Its waves are
sent in flight together as saved (each request asking for 24 tokens); each request of the last
wave is then served alone (cold). For each request of the last wave: whose text alone its
reply's own TEXT equals (the API's, no tap involved), and whose logits alone the tap's logits
for it equal (|diff| 0), as the waves property compares them.

If the engine answered a request with another's pixels, its text in the wave is the other's
text alone. If the tap gave its reply another's track (the ids cannot tell them apart), the
texts agree while the tap's logits are exchanged.

Run from the checkout, SEED_DIR naming the seed engines, TMPDIR a scratch directory:
    SEED_DIR=<main>/.engines/seed python benchmarks/results/seed_claims/exchange_text.py \
        WAVE_DIR [TRIES [FLAGS...]]
WAVE_DIR: a saved wave of fixtures/corpus/third_party. Default flags:
``--continuous-batching --mllm --max-num-seqs 2``.
"""

from __future__ import annotations

import dataclasses
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from pytest_prefixcache.adapters.seed import seed_server
from pytest_prefixcache.output.streams import load_stream, waves_from
from pytest_prefixcache.types import Outcome

FLAGS = ["--continuous-batching", "--mllm", "--max-num-seqs", "2"]
TOKENS = 24  # long enough for the greedy texts of other images to differ


def same(x: Outcome, y: Outcome) -> bool:
    assert x.logits is not None and y.logits is not None
    return float(np.abs(x.logits - y.logits).max()) == 0.0


def whose(i: int, mine: Outcome, alone: list[Outcome], by_text: bool) -> str:
    """Which requests alone (by index in the last wave) ``mine`` equals, its own first."""
    hits = [j for j, a in enumerate(alone) if (mine.text == a.text if by_text else same(mine, a))]
    return ",".join(f"{j}{'' if j == i else '!'}" for j in sorted(hits, key=lambda j: j != i))


def main() -> None:
    stream, meta = load_stream(Path(sys.argv[1]))
    tries = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    flags = sys.argv[3:] or FLAGS
    waves = waves_from(stream, meta)
    assert waves is not None, "no waves in the file"
    waves = tuple(
        dataclasses.replace(
            w,
            requests=tuple(dataclasses.replace(r, max_new_tokens=TOKENS) for r in w.requests),
        )
        for w in waves
    )
    last = waves[-1].requests
    with seed_server("vllm-mlx", flags, concurrency=4, audit=False, claims=False) as e:
        alone = [e.run(r, use_cache=False) for r in last]
        texts = {a.text for a in alone}
        print(f"{len(last)} requests in the last wave, {len(texts)} distinct texts alone")
        for i, a in enumerate(alone):
            print(f"  alone {i}: {a.text!r}")
        for attempt in range(tries):
            e.reset()
            for w in waves:
                with ThreadPoolExecutor(len(w.requests)) as pool:
                    got = list(pool.map(lambda r: e.run(r, use_cache=True), w.requests))
            rows = [
                f"{i}: text={whose(i, g, alone, True)} tap={whose(i, g, alone, False)}"
                for i, g in enumerate(got)
            ]
            served = [g.served for g in got]
            how = [g.attribution for g in got]
            print(f"try {attempt}: {'; '.join(rows)}; served {served}; by {how}", flush=True)
    print("(j: equals request j alone; j!: another request's)")


if __name__ == "__main__":
    main()
