"""A prefix-cache hit under rapid-mlx's live quantized KV (``--kv-cache-dtype int8|int4``, the
default int4 of 0.12.7 and 0.12.8) against the same prompt served cold, on an engine
environment's own rapid-mlx and mlx-lm (run with that venv's python): no server, no logit tap.

rapid-mlx quantizes the live continuous-batching KV (#1197: ``install_quantized_batch_cache``
makes mlx-lm's ``BatchGenerator`` merge ``QuantizedBatchKVCache``). A cache it stores comes out
of ``BatchGenerator.extract_cache``, and ``QuantizedBatchKVCache.extract`` returns a
*dequantized* ``KVCache``; a hit goes back through ``normalize_caches_for_quantization`` and
``QuantizedBatchKVCache.merge``, which *quantizes it again*. MLX's affine quantization is not
idempotent (``quantize(dequantize(q)) != q`` for some groups), so the reused prefix holds other
KV than the cold run's, quantized once.

This script does what the server does for a boundary snapshot (``Scheduler.
_snapshot_boundary_segments``: ``insert_segments([[prefix, rest]])``, ``extract_cache`` at the
prefix segment's end, ``_extract_cache_states`` and ``_reconstruct_cache_from_states``) and for
the hit (``normalize_caches_for_quantization``, then ``insert`` of the rest with that cache),
with the engine's own functions, and prints one JSON object: for each prompt the largest
|difference| of the first token's logprobs between the resumed and the cold run, with live
quantization (``bits``) and without it (the negative control: exact), the fraction of the
stored snapshot's KV groups that change on one more quantization round trip, and the versions.

    python engines/seed/requantized_resume.py MODEL_DIR BITS PREFIX_TOKENS
"""

from __future__ import annotations

import copy
import importlib
import json
import sys
from typing import Any

GROUP_SIZE = 32  # what rapid-mlx settles on for head_dim 32 ("adjusted live group_size 64->32")
#: The prompts: a chat turn of the fixture's tokenizer (its chat template), long and short;
#: "saved": the request of the server's shrunk failure (fixtures/corpus/third_party/
#: rapid-mlx-text-qwen3-5-memory-int4-auto-equivalence: resumed from 8 of 22 tokens, 0.112).
CHATS = {
    "saved": [{"role": "user", "content": "describe the image"}],
    "short": [{"role": "user", "content": "Name a colour."}],
    "long": [
        {
            "role": "system",
            "content": "You are a careful assistant for a software team. Answer briefly and "
            "precisely, cite the files you read, and say when you are guessing.",
        },
        {"role": "user", "content": "Why does test_parse_dates fail? Start by reading dates.py."},
    ],
}


def _engine() -> Any:
    """The installed rapid-mlx's package: ``rapid_mlx`` from 0.13 on, ``vllm_mlx`` before (a
    history venv layered over the seed environment sees the seed's ``rapid_mlx`` too: the one
    in the distribution's own directory is the one its console script runs)."""
    import importlib.metadata as md
    from pathlib import Path

    home = Path(str(md.distribution("rapid-mlx").locate_file(""))).resolve()
    for name in ("rapid_mlx", "vllm_mlx"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if Path(str(module.__file__)).resolve().is_relative_to(home):
            return module
    raise SystemExit(f"no rapid_mlx or vllm_mlx package under {home}")


def main(model_dir: str, bits: int, prefix: int) -> dict[str, Any]:
    import importlib.metadata as md

    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator

    pkg = _engine().__name__
    qbc = importlib.import_module(f"{pkg}.quantized_batch_cache")
    scheduler = importlib.import_module(f"{pkg}.scheduler").Scheduler
    loaded = load(model_dir)
    model, tok = loaded[0], loaded[1]

    def run(segments: list[list[int]], quant: bool, cache: Any = None) -> tuple[Any, Any]:
        """First-token logprobs of one request, and the cache at its first segment's end."""
        gen = BatchGenerator(model, max_tokens=1)
        if quant:
            qbc.install_quantized_batch_cache(gen, group_size=GROUP_SIZE, bits=bits)
        (uid,) = gen.insert_segments([segments], max_tokens=[1], caches=[cache] if cache else None)
        snapshot = None
        while True:
            prompts, generated = gen._next()
            for r in prompts:
                if r.end_of_segment and not r.end_of_prompt and snapshot is None:
                    snapshot = gen.extract_cache([uid])[uid][0]
                    mx.eval([c.state for c in snapshot])
            if generated:
                return generated[0].logprobs, snapshot

    def resumed(ids: list[int], quant: bool) -> float:
        cold, _ = run([ids], quant)
        _, snap = run([ids[:prefix], ids[prefix:]], quant)  # the store
        stored = scheduler._reconstruct_cache_from_states(
            None, scheduler._extract_cache_states(None, snap)
        )
        cache = copy.deepcopy(stored)
        if quant:  # the hit, as Scheduler._schedule_waiting prepares it
            cache = qbc.normalize_caches_for_quantization(cache, GROUP_SIZE, bits)
        warm, _ = run([ids[prefix:]], quant, cache)
        return float(mx.abs(warm - cold).max())

    def round_trip(ids: list[int]) -> float:
        """The stored snapshot's KV groups that change when quantized once more."""
        _, snap = run([ids[:prefix], ids[prefix:]], True)
        changed = total = 0
        for layer in snap:
            if type(layer).__name__ != "KVCache" or layer.keys is None:
                continue
            for x in (layer.keys, layer.values):
                again = mx.dequantize(
                    *mx.quantize(x, group_size=GROUP_SIZE, bits=bits),
                    group_size=GROUP_SIZE,
                    bits=bits,
                )
                groups = (again != x).reshape(*x.shape[:-1], -1, GROUP_SIZE).any(axis=-1)
                changed += int(groups.sum().item())
                total += groups.size
        return changed / total if total else 0.0

    prompts = {k: tok.apply_chat_template(v, add_generation_prompt=True) for k, v in CHATS.items()}
    return {
        "engine": pkg,
        "version": md.version("rapid-mlx"),
        "mlx": md.version("mlx"),
        "mlx_lm": md.version("mlx-lm"),
        "bits": bits,
        "prefix": prefix,
        "prompt_tokens": {k: len(v) for k, v in prompts.items()},
        "live_quantized": {k: resumed(v, True) for k, v in prompts.items()},
        "not_quantized": {k: resumed(v, False) for k, v in prompts.items()},
        "groups_changed_by_one_more_round_trip": round_trip(prompts["long"]),
    }


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python engines/seed/requantized_resume.py MODEL_DIR BITS PREFIX_TOKENS")
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
