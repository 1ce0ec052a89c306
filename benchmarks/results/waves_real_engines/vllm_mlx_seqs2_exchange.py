"""vllm-mlx 0.6.0 --continuous-batching --mllm --max-num-seqs 2: the saved wave (two requests,
the same text, images A and B) sent in flight together three times; each cached reply compared
with both cold replies (max |diff| at the last prompt position, through the logit tap).

Run from the checkout with SEED_DIR naming the seed engines (output as in
vllm_mlx_seqs2_exchange.txt):
    SEED_DIR=<main>/.engines/seed python \
        benchmarks/results/waves_real_engines/vllm_mlx_seqs2_exchange.py
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from pytest_prefixcache.adapters.seed import seed_server
from pytest_prefixcache.output.streams import load_stream
from pytest_prefixcache.types import Outcome

ROOT = Path(__file__).resolve().parents[3]
WAVE = "vllm-mlx-waves-cb-mllm-memory-whole-seqs2-equivalence"
FLAGS = ["--continuous-batching", "--mllm", "--max-num-seqs", "2"]


def diff(x: Outcome, y: Outcome) -> float:
    assert x.logits is not None and y.logits is not None
    return float(np.abs(x.logits - y.logits).max())


def main() -> None:
    (a, b), _ = load_stream(ROOT / "fixtures" / "corpus" / "third_party" / WAVE)
    with seed_server("vllm-mlx", FLAGS, concurrency=4, audit=False) as e:
        for attempt in range(3):
            e.reset()
            with ThreadPoolExecutor(2) as pool:
                ca, cb = pool.map(lambda r: e.run(r, use_cache=True), [a, b])
            ra, rb = e.run(a, use_cache=False), e.run(b, use_cache=False)
            print(
                f"try {attempt}: cachedA-coldA {diff(ca, ra):.4g} cachedA-coldB {diff(ca, rb):.4g} "
                f"cachedB-coldB {diff(cb, rb):.4g} cachedB-coldA {diff(cb, ra):.4g} "
                f"coldA-coldB {diff(ra, rb):.4g}",
                flush=True,
            )


if __name__ == "__main__":
    main()
