"""How far mlx-lm's quantized-KV path is between a cold request and a warm one, and how far the
smallest real cache bug moves the same logits: the measurement behind the quantized-KV rule of
``pytest_prefixcache/adapters/tolerances.py`` (``KV_QUANT_ATOL``), by split_tolerance.py's
method.

    python benchmarks/kv_quant_tolerance.py --trials 12        # prints a table, writes JSON

mlx_lm.server runs a request as ``generate_step`` does: the prompt but its last token in one
chunk (``--prefill-step-size`` 2048 is longer than any prompt here), then
``maybe_quantize_kv_cache`` (every KVCache whose offset reached ``--quantized-kv-start`` is
converted whole, ``to_quantized``), then the last token, attending quantized rows. A cold
request does that once. A warm one resumes from the cache its first request left: the prefix
ran as a request of its own (converted at its end), and the suffix then attends the quantized
prefix with every position, where the cold run attended it in full precision with all but the
last. For each bits/start setting, seeded random prompts of 40 to 800 tokens are run cold and
split at a random point as two requests; the worst |difference| of the last position's
log-softmax is reported, with whether the argmax changed, beside the unquantized split
(exact on these fixtures). The negative control: the cold quantized prompt with one token
replaced 8 to 40 positions before its end; its smallest effect must stay far above the rule.
Writes ``results/kv_quant_tolerance.json``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tolerance_cases import Column, fresh_cache, last_logprobs, main

#: (bits, group size, start) settings measured; (library, fixture) cases: the fixtures
#: mlx_lm.server can quantize (head dim 32, no sliding window: engines/mlx-lm/matrix.toml).
SETTINGS = ((4, 32, 0), (8, 32, 0), (4, 32, 48))
CASES = (("mlx-lm", "tiny-qwen3.5"),)
COLUMNS = (
    Column("worst_unquantized_split", "worst unquantized split", "worst"),
    *(
        Column(f"worst_q{b}s{s}", f"worst cold vs warm, {b} bits from {s}", "worst")
        for b, _, s in SETTINGS
    ),
    Column("argmax_changed", "argmax changed", "count", ""),
    *(
        Column(f"smallest_bug_q{b}s{s}", f"smallest one-token bug, {b} bits from {s}", "smallest")
        for b, _, s in SETTINGS
    ),
)


def request(
    model: Any, cache: list[Any], ids: Sequence[int], setting: tuple[int, int, int] | None
) -> np.ndarray:
    """One request on ``cache`` as generate_step runs it: all but the last token, the cache
    quantized where its offset reached the start, then the last token; its log-softmax."""
    import mlx.core as mx
    from mlx_lm.generate import maybe_quantize_kv_cache

    def quantize() -> None:
        if setting is not None:
            bits, group, start = setting
            maybe_quantize_kv_cache(cache, start, group, bits)

    if len(ids) > 1:
        model(mx.array([list(ids[:-1])]), cache=cache)
        quantize()
    out = model(mx.array([list(ids[-1:])]), cache=cache)
    quantize()
    return last_logprobs(out)


def run(
    model: Any, requests: Sequence[Sequence[int]], setting: tuple[int, int, int] | None
) -> np.ndarray:
    cache = fresh_cache(model)
    out = None
    for ids in requests:
        out = request(model, cache, ids, setting)
    assert out is not None
    return out


def trial(model: Any, rng: np.random.Generator, vocab: int) -> dict[str, float]:
    n = int(rng.integers(40, 800))
    ids = rng.integers(10, vocab, size=n).tolist()
    k = int(rng.integers(2, n - 2))
    stale = list(ids)
    at = n - int(rng.integers(8, 41))
    stale[at] = 10 + (stale[at] - 10 + 1) % (vocab - 10)
    plain = run(model, [ids], None)
    out = {
        "worst_unquantized_split": float(
            np.max(np.abs(plain - run(model, [ids[:k], ids[k:]], None)))
        )
    }
    changed = 0
    for bits, group, start in SETTINGS:
        s = (bits, group, start)
        cold = run(model, [ids], s)
        warm = run(model, [ids[:k], ids[k:]], s)
        out[f"worst_q{bits}s{start}"] = float(np.max(np.abs(cold - warm)))
        out[f"smallest_bug_q{bits}s{start}"] = float(np.max(np.abs(cold - run(model, [stale], s))))
        changed += int(cold.argmax() != warm.argmax())
    out["argmax_changed"] = changed
    return out


if __name__ == "__main__":
    sys.exit(main(__file__, __doc__, CASES, trial, COLUMNS))
