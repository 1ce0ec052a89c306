"""Tolerance rules of engines whose own split prefill is not bit-exact on a model family.

Exact stays the default: on MLX's CPU device most language models give bit-identical logits for
a one-shot prefill and a split one. Where a library's model is not (mlx-vlm's ``qwen3_5``: its
recurrent layers prefill in 64-token chunks, so a split elsewhere rounds differently; a last
token run alone on Gemma), a cache that reuses a prefix legitimately differs from a cold run,
and an engine built on that library declares the rule below as its ``atol`` (greedy tokens
must still agree; the report names the rule). The numbers come from
``benchmarks/split_tolerance.py`` (``benchmarks/results/split_tolerance.json``): the worst
difference seen, with a margin, and far below the smallest effect of a one-token cache bug
measured on the same fixture (the rule's negative control, ``tests/test_tolerances.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = [
    "DECODE_ATOL",
    "ENGINE_ATOL",
    "SPLIT_ATOL",
    "decode_atol",
    "decode_rule",
    "engine_atol",
    "engine_rule",
    "model_type_of",
    "split_atol",
    "split_rule",
]

#: (library, model_type) -> atol on every step's logprobs: the worst difference measured, times
#: about 6 (``results/split_tolerance.json``; the margin covers longer prompts than measured).
SPLIT_ATOL: dict[tuple[str, str], float] = {
    ("mlx-vlm", "qwen3_5"): 5e-3,  # any split off a multiple of 64 (its recurrent chunking)
    ("mlx-vlm", "qwen3_5_moe"): 5e-3,  # the same language model code
    ("mlx-vlm", "gemma3"): 2e-4,  # a last token run alone
    ("mlx-lm", "gemma3_text"): 2e-4,  # a last token run alone
}


def model_type_of(model_dir: str | os.PathLike[str]) -> str:
    """The ``model_type`` of a model directory's config.json ("" when unreadable)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return str(config.get("model_type", ""))


def split_atol(library: str, model_type: str) -> float | None:
    """The atol an engine on ``library`` declares for a model of ``model_type``; None where
    the library's split prefill is exact on it."""
    return SPLIT_ATOL.get((library, model_type)) or None


def split_rule(library: str, model_type: str) -> str:
    """How the report names the rule (empty where none applies)."""
    atol = split_atol(library, model_type)
    if atol is None:
        return ""
    return (
        f"{library} {model_type}: a split prefill is not bit-exact on CPU; atol {atol:g} on "
        "every step's logprobs, greedy tokens equal (benchmarks/split_tolerance.py)"
    )


#: The decode rule: (library, model_type) -> atol on every step's logprobs of a request whose
#: cached run reused KV computed while decoding (a one-token decode step vs a prefill of the
#: same position): the worst difference measured by ``benchmarks/decode_tolerance.py``
#: (``results/decode_tolerance.json``), times about 6. It applies ONLY to such requests (the
#: verifier's ``tolerance_for``); every other request stays exact. Families absent here
#: measured 0.0: their decode-time KV is bit-exact.
DECODE_ATOL: dict[tuple[str, str], float] = {
    ("mlx-vlm", "qwen3_5"): 1e-3,  # 1.14e-4 measured (its recurrent layers' chunking)
    ("mlx-vlm", "qwen3_5_moe"): 1e-3,  # the same language model code
    ("mlx-vlm", "gemma3"): 2e-4,  # 2.29e-5 measured
    ("mlx-lm", "gemma3_text"): 2e-4,  # 2.29e-5 measured
}


def decode_atol(library: str, model_type: str) -> float | None:
    """The decode rule's atol for a model of ``model_type`` run by ``library``; None where a
    decode step and a prefill of the same position agree bit for bit."""
    return DECODE_ATOL.get((library, model_type)) or None


def decode_rule(library: str, model_type: str) -> str:
    """How the report names the decode rule (empty where none applies)."""
    atol = decode_atol(library, model_type)
    if atol is None:
        return ""
    return (
        f"{library} {model_type}: a one-token decode step and a prefill of the same position "
        f"are not bit-exact on CPU; atol {atol:g} on every step's logprobs of a request that "
        "reused KV computed while decoding, greedy tokens equal (benchmarks/decode_tolerance.py)"
    )


#: (engine, model_type or "*") -> atol on every step's logprobs of a server whose cached and
#: cold runs are not bit-identical (a third-party engine on its own kernels): the worst
#: difference measured over many requests, times about 10, far below the smallest one-token
#: cache bug measured on the same server.
#: SGLang 0.5.23 on CPU (torch-native attention, float32, tiny-llama-hf; 40 random prompts,
#: a random prefix cached, 4 steps x 480 logprobs; engines/sglang/results/tolerance.json):
#: cached vs flushed worst 1.9e-6, median 9.5e-7, 6 of 40 exact; the smallest one-token bug
#: (one reused token replaced) moves step 0 by 0.020 (median 0.079), 1000x the rule.
ENGINE_ATOL: dict[tuple[str, str], float] = {
    ("sglang", "*"): 2e-5,
}
#: Where each engine's figure comes from.
ENGINE_SOURCE = {"sglang": "engines/sglang/tolerance.py"}


def engine_atol(engine: str, model_type: str) -> float | None:
    """The atol ``engine``'s preset declares for a model of ``model_type`` (its own entry,
    else the engine's ``"*"``); None where it is exact."""
    return ENGINE_ATOL.get((engine, model_type)) or ENGINE_ATOL.get((engine, "*")) or None


def engine_rule(engine: str, model_type: str) -> str:
    """How the report names the engine's rule (empty where none applies)."""
    atol = engine_atol(engine, model_type)
    if atol is None:
        return ""
    return (
        f"{engine} {model_type or 'any model'}: cached and cold runs are not bit-exact on CPU; "
        f"atol {atol:g} on every step's logprobs, greedy tokens equal "
        f"({ENGINE_SOURCE.get(engine, 'measured')})"
    )
