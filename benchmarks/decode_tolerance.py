"""How far KV computed while decoding is from a prefill of the same positions, per library and
model family, and how far the smallest real bug in that KV moves the same logits: the
measurement behind the decode rule of ``pytest_prefixcache/adapters/tolerances.py``.

    python benchmarks/decode_tolerance.py --trials 12        # prints a table, writes JSON

A prompt+output cache keeps the KV rows its decode computed (one token per step) and reuses
them for the next turn, whose prompt carries the reply; a cold run prefills those positions in
one chunk. For each fixture and each library that loads it (mlx-lm for the text fixtures,
mlx-vlm for the VLMs' language models), a seeded random prompt of 40 to 600 tokens is
prefilled, k = 2 to 8 output tokens are decoded one step at a time (greedy), then the next
turn's suffix (4 to 40 random tokens) is prefilled on top of the decode-time KV of all but the
last output token (what the cache reuses) and, for the cold side, the whole next prompt in one
chunk. The worst |difference| of the last position's log-softmax is reported with whether the
argmax changed. The negative control is the smallest real bug in decode-time KV: the KV of
one output token computed for its neighbour (an output stored one position off); its smallest
effect must stay far above any rule. Writes ``results/decode_tolerance.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tolerance_cases import Column, fresh_cache, last_logprobs, main, run

#: (library, fixture) pairs measured: every fixture, by the library that serves it.
CASES = (
    ("mlx-lm", "tiny-llama"),
    ("mlx-lm", "tiny-qwen3.5"),
    ("mlx-lm", "tiny-gemma3-text"),
    ("mlx-lm", "tiny-gemma4-text"),
    ("mlx-vlm", "tiny-qwen2-vl"),
    ("mlx-vlm", "tiny-qwen3.5-vl"),
    ("mlx-vlm", "tiny-gemma3"),
    ("mlx-vlm", "tiny-gemma4"),
)
COLUMNS = (
    Column("worst_decode_vs_prefill", "worst decode vs prefill", "worst"),
    Column("argmax_changed", "argmax changed", "count", ""),
    Column("smallest_output_off_by_one", "smallest bug", "smallest"),
)


def greedy(model: Any, prompt: list[int], k: int, lo: int) -> list[int]:
    """k greedy tokens after ``prompt``, decoded one step at a time (ids >= ``lo``)."""
    import mlx.core as mx

    cache = fresh_cache(model)
    out = model(mx.array([prompt]), cache=cache)
    tokens: list[int] = []
    for _ in range(k):
        lp = last_logprobs(out)
        tokens.append(lo + int(np.argmax(lp[lo:])))
        out = model(mx.array([tokens[-1:]]), cache=cache)
    return tokens


def trial(model: Any, rng: np.random.Generator, vocab: int) -> dict[str, float]:
    """One seeded prompt, its greedy output and the next turn: the cache's way (decode-time KV)
    vs the cold prefill, and the negative control (one output's KV for its neighbour)."""
    n = int(rng.integers(40, 600))
    prompt = rng.integers(10, vocab, size=n).tolist()
    k = int(rng.integers(2, 9))
    out = greedy(model, prompt, k, 10)
    suffix = rng.integers(10, vocab, size=int(rng.integers(4, 41))).tolist()
    nxt = prompt + out + suffix
    cold = run(model, [nxt])
    # the cache: the prompt prefilled, the output's KV from one-token steps (all but the
    # last output token, never fed back), then the rest of the next prompt
    steps = [[t] for t in out[:-1]]
    warm = run(model, [prompt, *steps, nxt[n + k - 1 :]])
    # the negative control: one output token's KV computed for its neighbour
    at = int(rng.integers(0, k - 1))
    shifted = list(out[:-1])
    shifted[at] = prompt[-1] if at == 0 else out[at - 1]
    if shifted[at] == out[at]:
        shifted[at] = 10 + (out[at] - 10 + 1) % (vocab - 10)
    stale = run(model, [prompt, *[[t] for t in shifted], nxt[n + k - 1 :]])
    return {
        "worst_decode_vs_prefill": float(np.max(np.abs(cold - warm))),
        "argmax_changed": int(cold.argmax() != warm.argmax()),
        "smallest_output_off_by_one": float(np.max(np.abs(cold - stale))),
    }


if __name__ == "__main__":
    raise SystemExit(main(__file__, __doc__, CASES, trial, COLUMNS))
