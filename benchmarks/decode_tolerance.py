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

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from split_tolerance import language_model

RESULTS = Path(__file__).resolve().parent / "results"
#: (library, fixture) pairs measured: every fixture, by the library that serves it.
CASES = (
    ("mlx-lm", "tiny-llama"),
    ("mlx-lm", "tiny-qwen3.5"),
    ("mlx-lm", "tiny-gemma3-text"),
    ("mlx-vlm", "tiny-qwen2-vl"),
    ("mlx-vlm", "tiny-qwen3.5-vl"),
    ("mlx-vlm", "tiny-gemma3"),
)


def _fresh(model: Any) -> list[Any]:
    for attr in ("_position_ids", "_rope_deltas"):  # mlx-vlm's Qwen VLMs keep them per prompt
        if hasattr(model, attr):
            setattr(model, attr, None)
    if hasattr(model, "make_cache"):
        return list(model.make_cache())
    from mlx_vlm.models.cache import KVCache

    return [KVCache() for _ in model.layers]


def _last(out: Any) -> np.ndarray:
    import mlx.core as mx

    logits = getattr(out, "logits", out)[0, -1].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits))


def run(model: Any, chunks: list[list[int]]) -> np.ndarray:
    """Feed ``chunks`` in order into one fresh cache; the last position's log-softmax."""
    import mlx.core as mx

    cache = _fresh(model)
    out = None
    for chunk in chunks:
        out = model(mx.array([chunk]), cache=cache)
    return _last(out)


def greedy(model: Any, prompt: list[int], k: int, lo: int) -> list[int]:
    """k greedy tokens after ``prompt``, decoded one step at a time (ids >= ``lo``)."""
    import mlx.core as mx

    cache = _fresh(model)
    out = model(mx.array([prompt]), cache=cache)
    tokens: list[int] = []
    for _ in range(k):
        lp = _last(out)
        tokens.append(lo + int(np.argmax(lp[lo:])))
        out = model(mx.array([tokens[-1:]]), cache=cache)
    return tokens


def measure(library: str, fixture: str, trials: int, seed: int) -> dict[str, Any]:
    from pytest_prefixcache.package_data import fixture_model

    model, model_type = language_model(library, fixture)
    config = json.loads((fixture_model(fixture) / "config.json").read_text())
    vocab = int(config.get("text_config", config).get("vocab_size", config.get("vocab_size")))
    rng = np.random.default_rng(seed)
    worst = 0.0
    bug = float("inf")
    argmax_changed = 0
    for _ in range(trials):
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
        worst = max(worst, float(np.max(np.abs(cold - warm))))
        argmax_changed += int(cold.argmax() != warm.argmax())
        # the negative control: one output token's KV computed for its neighbour
        at = int(rng.integers(0, k - 1))
        shifted = list(out[:-1])
        shifted[at] = prompt[-1] if at == 0 else out[at - 1]
        if shifted[at] == out[at]:
            shifted[at] = 10 + (out[at] - 10 + 1) % (vocab - 10)
        stale = run(model, [prompt, *[[t] for t in shifted], nxt[n + k - 1 :]])
        bug = min(bug, float(np.max(np.abs(cold - stale))))
    return {
        "library": library,
        "fixture": fixture,
        "model_type": model_type,
        "trials": trials,
        "worst_decode_vs_prefill": worst,
        "argmax_changed": argmax_changed,
        "smallest_output_off_by_one": bug,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12, help="prompts per case (default 12)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "decode_tolerance.json")
    args = parser.parse_args(argv)
    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    rows = [measure(lib, fix, args.trials, args.seed) for lib, fix in CASES]
    print("| library | fixture | worst decode vs prefill | argmax changed | smallest bug |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['library']} | {r['fixture']} | {r['worst_decode_vs_prefill']:.2e} | "
            f"{r['argmax_changed']} | {r['smallest_output_off_by_one']:.2e} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/decode_tolerance.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    args.out.write_text(json.dumps({"command": command.strip(), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
