"""Cold vs warm prefill after one changed late image, against the suffix-only physical limit.

    python benchmarks/prefill.py                  # the tiny fixture
    python benchmarks/prefill.py --large          # a random hidden-512, 8-layer Qwen2-VL

A conversation of at least 4,000 tokens with 4 images is run once to fill the cache; then the
same conversation with its last image replaced is timed three ways (median of --repeats):
cold (use_cache=False), warm (use_cache=True, the cache holding the first conversation), and
the limit (``limits.py``: the new image encoded and the suffix prefilled over its prefix KV
already in place, the work no prefix cache can avoid): warm / limit near 1.0 means the cache
costs nothing beyond it. Suffix-only (the suffix from an empty cache, no prefix) is printed
for comparison; it is not a valid computation, so not a limit.
Prints a table and, with --json PATH, writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from limits import limit

from pytest_prefixcache import Image, Message, Request
from reference_engine import Engine, default_model_path


def image(seed: int, w: int, h: int) -> Image:
    rng = np.random.default_rng(seed)
    return Image(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))


def conversation(turns: int, last_image_seed: int) -> Request:
    words = " ".join(f"fact{i} is noted" for i in range(60))
    messages = [Message("system", (f"You are an agent. Background: {words}.",))]
    sizes = [(64, 64), (96, 48), (80, 80), (128, 64)]
    for t in range(turns):
        parts: list[str | Image] = [f"Turn {t}: please consider {words}."]
        if t % (turns // 4) == 0 and t // (turns // 4) < 3:
            w, h = sizes[t // (turns // 4)]
            parts.append(image(100 + t, w, h))
        messages.append(Message("user", tuple(parts)))
        messages.append(Message("assistant", (f"Answer {t}: understood, {words[:80]}.",)))
    w, h = sizes[3]
    messages.append(Message("user", ("And finally this one:", image(last_image_seed, w, h))))
    return Request(tuple(messages))


def timed(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def bench(engine: Engine, turns: int, repeats: int) -> dict[str, float]:
    first, second = conversation(turns, 1), conversation(turns, 2)

    def warm() -> None:
        engine.reset()
        engine.run(first, use_cache=True)
        t0 = time.perf_counter()
        out = engine.run(second, use_cache=True)
        warm.elapsed = time.perf_counter() - t0  # type: ignore[attr-defined]
        warm.cached = out.cached_tokens  # type: ignore[attr-defined]
        warm.prompt = out.prompt_tokens  # type: ignore[attr-defined]

    warm_times = []
    for _ in range(repeats):
        warm()
        warm_times.append(warm.elapsed)  # type: ignore[attr-defined]
    cached, prompt = warm.cached, warm.prompt  # type: ignore[attr-defined]
    cold = timed(lambda: engine.run(second, use_cache=False), repeats)

    # the limit (limits.py): the new image encoded and the suffix prefilled over its prefix KV
    # already in place; suffix-only: the suffix from an empty cache (not a valid computation)
    samples = []
    for _ in range(repeats):
        engine.reset()
        engine.run(first, use_cache=True)
        samples.append(limit(engine, second))
    lim = min(samples, key=lambda s: s.limit_s)
    compute = statistics.median(s.limit_s for s in samples)
    suffix = statistics.median(s.suffix_only_s for s in samples)
    return {
        "prompt_tokens": prompt,
        "images": len(second.images),
        "cached_tokens": cached,
        "cold_s": cold,
        "warm_s": statistics.median(warm_times),
        "suffix_only_s": suffix,
        "warm_over_suffix": statistics.median(warm_times) / suffix,
        "limit_s": compute,
        "limit_embed_s": lim.embed_s,
        "warm_over_limit": statistics.median(warm_times) / compute,
        "cold_over_warm": cold / statistics.median(warm_times),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="Use a random hidden-512, 8-layer model")
    ap.add_argument("--turns", type=int, default=8, help="User turns (default 8)")
    ap.add_argument("--repeats", type=int, default=5, help="Timed repeats (default 5)")
    ap.add_argument("--json", type=Path, help="Write the figures to this JSON file")
    args = ap.parse_args(argv)
    mx.set_default_device(mx.cpu)
    if args.large:
        from reference_engine.fixtures import build_qwen2_vl

        path = build_qwen2_vl(
            Path(tempfile.mkdtemp(prefix="prefixcache-bench-")),
            hidden_size=512,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            intermediate_size=1408,
        )
    else:
        path = default_model_path()
    engine = Engine.from_pretrained(path)
    figures = bench(engine, args.turns, args.repeats)
    figures["model"] = "large (hidden 512, 8 layers)" if args.large else "tiny fixture"
    for k, v in figures.items():
        print(f"{k:>18}: {v:.4f}" if isinstance(v, float) else f"{k:>18}: {v}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
