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

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pytest_prefixcache.package_data import fixture_model

RESULTS = Path(__file__).resolve().parent / "results"
#: (library, fixture) pairs measured.
CASES = (
    ("mlx-lm", "tiny-qwen3.5"),
    ("mlx-lm", "tiny-gemma3-text"),
    ("mlx-vlm", "tiny-qwen3.5-vl"),
    ("mlx-vlm", "tiny-gemma3"),
    ("mlx-vlm", "tiny-qwen2-vl"),
)


def language_model(library: str, fixture: str) -> tuple[Any, str]:
    """The model whose forward the library's servers run, and its model type."""
    path = fixture_model(fixture)
    if library == "mlx-lm":
        from mlx_lm import load

        model = load(str(path))[0]
        return model, str(model.model_type)
    from mlx_vlm import load as vlm_load

    model = vlm_load(str(path))[0]
    return model.language_model, str(model.config.model_type)


def last_logprobs(model: Any, ids: list[int], cuts: list[int]) -> np.ndarray:
    import mlx.core as mx

    for attr in ("_position_ids", "_rope_deltas"):  # mlx-vlm's Qwen VLMs keep them per prompt
        if hasattr(model, attr):
            setattr(model, attr, None)
    if hasattr(model, "make_cache"):
        cache = model.make_cache()
    else:  # mlx-vlm's Qwen2-VL: full attention only
        from mlx_vlm.models.cache import KVCache

        cache = [KVCache() for _ in model.layers]
    start, out = 0, None
    for end in [*cuts, len(ids)]:
        out = model(mx.array([ids[start:end]]), cache=cache)
        start = end
    logits = getattr(out, "logits", out)[0, -1].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits))


def measure(library: str, fixture: str, trials: int, seed: int) -> dict[str, Any]:
    model, model_type = language_model(library, fixture)
    config = json.loads((fixture_model(fixture) / "config.json").read_text())
    vocab = int(config.get("text_config", config).get("vocab_size", config.get("vocab_size")))
    rng = np.random.default_rng(seed)
    split = last = 0.0
    bug = float("inf")
    argmax_changed = 0
    for _ in range(trials):
        n = int(rng.integers(40, 800))
        ids = rng.integers(10, vocab, size=n).tolist()
        one = last_logprobs(model, ids, [])
        k = int(rng.integers(2, n - 2))
        two = last_logprobs(model, ids, [k])
        end = last_logprobs(model, ids, [n - 1])
        split = max(split, float(np.max(np.abs(one - two))))
        last = max(last, float(np.max(np.abs(one - end))))
        argmax_changed += int(one.argmax() != two.argmax()) + int(one.argmax() != end.argmax())
        stale = list(ids)
        at = n - int(rng.integers(8, 41))
        stale[at] = 10 + (stale[at] - 10 + 1) % (vocab - 10)
        bug = min(bug, float(np.max(np.abs(one - last_logprobs(model, stale, [])))))
    return {
        "library": library,
        "fixture": fixture,
        "model_type": model_type,
        "trials": trials,
        "worst_split": split,
        "worst_last_token_chunk": last,
        "argmax_changed": argmax_changed,
        "smallest_one_token_bug": bug,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12, help="prompts per case (default 12)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "split_tolerance.json")
    args = parser.parse_args(argv)
    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    rows = [measure(lib, fix, args.trials, args.seed) for lib, fix in CASES]
    print(
        "| library | fixture | worst split | worst last-token chunk | argmax changed | "
        "smallest one-token bug |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['library']} | {r['fixture']} | {r['worst_split']:.2e} | "
            f"{r['worst_last_token_chunk']:.2e} | {r['argmax_changed']} | "
            f"{r['smallest_one_token_bug']:.2e} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/split_tolerance.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    args.out.write_text(json.dumps({"command": command.strip(), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
