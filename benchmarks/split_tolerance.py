"""How far a split prefill is from a one-shot one, per library and model family, and how far
the smallest real cache bug moves the same logits: the measurement behind the tolerance rules
of ``pytest_prefixcache/adapters/tolerances.py``.

    python benchmarks/split_tolerance.py --trials 12          # prints a table, writes JSON

For each fixture and each library that loads it (mlx-lm for the text fixtures, mlx-vlm for the
VLMs' language models), seeded random prompts of 40 to 800 tokens are prefilled one-shot and
split in two at a random point, and with the last token as a chunk of its own (what a cache
that reuses all but the last token computes); the worst |difference| of the last position's
log-softmax is reported, with whether the argmax changed. The negative control: the same
prompt with one token replaced 8 to 40 positions before its end (what a stale or off-by-one
cached row does at the least); its smallest effect must stay far above any tolerance.
Writes ``results/split_tolerance.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tolerance_cases import Column, main, run

#: (library, fixture) pairs measured.
CASES = (
    ("mlx-lm", "tiny-qwen3.5"),
    ("mlx-lm", "tiny-gemma3-text"),
    ("mlx-lm", "tiny-gemma4-text"),
    ("mlx-vlm", "tiny-qwen3.5-vl"),
    ("mlx-vlm", "tiny-gemma3"),
    ("mlx-vlm", "tiny-gemma4"),
    ("mlx-vlm", "tiny-qwen2-vl"),
)
COLUMNS = (
    Column("worst_split", "worst split", "worst"),
    Column("worst_last_token_chunk", "worst last-token chunk", "worst"),
    Column("argmax_changed", "argmax changed", "count", ""),
    Column("smallest_one_token_bug", "smallest one-token bug", "smallest"),
)


def trial(model: Any, rng: np.random.Generator, vocab: int) -> dict[str, float]:
    """One seeded prompt: one-shot vs split at a random point and vs the last token alone,
    and the negative control (one token replaced 8 to 40 positions before the end)."""
    n = int(rng.integers(40, 800))
    ids = rng.integers(10, vocab, size=n).tolist()
    one = run(model, [ids])
    k = int(rng.integers(2, n - 2))
    two = run(model, [ids[:k], ids[k:]])
    end = run(model, [ids[: n - 1], ids[n - 1 :]])
    stale = list(ids)
    at = n - int(rng.integers(8, 41))
    stale[at] = 10 + (stale[at] - 10 + 1) % (vocab - 10)
    return {
        "worst_split": float(np.max(np.abs(one - two))),
        "worst_last_token_chunk": float(np.max(np.abs(one - end))),
        "argmax_changed": int(one.argmax() != two.argmax()) + int(one.argmax() != end.argmax()),
        "smallest_one_token_bug": float(np.max(np.abs(one - run(model, [stale])))),
    }


if __name__ == "__main__":
    raise SystemExit(main(__file__, __doc__, CASES, trial, COLUMNS))
