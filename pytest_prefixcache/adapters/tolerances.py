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
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "DECODE_ATOL",
    "ENGINE_ATOL",
    "KV_QUANT_ATOL",
    "LIBRARIES",
    "SPLIT_ATOL",
    "Identity",
    "Rules",
    "decode_atol",
    "decode_rule",
    "engine_atol",
    "engine_rule",
    "identify",
    "kv_bits_of",
    "kv_quant_rule",
    "model_dir_of",
    "model_type_of",
    "program_of",
    "rules_for",
    "split_atol",
    "split_rule",
    "with_measured_rules",
]

_E = TypeVar("_E", bound=Any)

#: (library, model_type) -> atol on every step's logprobs: the worst difference measured, times
#: about 6 (``results/split_tolerance.json``; the margin covers longer prompts than measured).
SPLIT_ATOL: dict[tuple[str, str], float] = {
    ("mlx-vlm", "qwen3_5"): 5e-3,  # any split off a multiple of 64 (its recurrent chunking)
    ("mlx-vlm", "qwen3_5_moe"): 5e-3,  # the same language model code
    ("mlx-vlm", "gemma3"): 2e-4,  # a last token run alone
    ("mlx-lm", "gemma3_text"): 2e-4,  # a last token run alone
    ("mlx-vlm", "gemma4"): 4e-4,  # a last token run alone (results/gemma4/)
    ("mlx-lm", "gemma4_text"): 4e-4,  # a last token run alone (results/gemma4/)
}


#: (library, model_type, --kv-bits) -> atol on every step's logprobs of a server run with KV
#: quantization: mlx-lm converts a cache whole once its offset reaches --quantized-kv-start
#: (``maybe_quantize_kv_cache``), so a warm request's suffix attends the quantized prefix with
#: every position where its cold run did with the last only. Measured by
#: ``benchmarks/kv_quant_tolerance.py --trials 12`` (results/kv_quant_tolerance.json; 40 to 800
#: tokens, group 32): worst cold vs warm 0.095 at 8 bits and 0.80 at 4 bits (start 0; 0.33 from
#: 48), argmax changed in 2 of 36; the smallest one-token bug 7.44 under each setting.
KV_QUANT_ATOL: dict[tuple[str, str, int], float] = {
    ("mlx-lm", "qwen3_5", 8): 0.6,  # 6x the worst, 12x below the smallest one-token bug
    ("mlx-lm", "qwen3_5", 4): 2.4,  # 3x the worst, 3x below the smallest one-token bug
}


def kv_bits_of(cmd: str | Sequence[str]) -> int | None:
    """The value of a server command's last ``--kv-bits`` (argparse keeps the last; None: none
    or not an int)."""
    words, bits = _words(cmd), None
    for i, word in enumerate(words):
        value = words[i + 1] if word == "--kv-bits" and i + 1 < len(words) else None
        if word.startswith("--kv-bits="):
            value = word.split("=", 1)[1]
        if value is not None:
            bits = int(value) if value.isdigit() else None
    return bits


def kv_quant_rule(library: str, model_type: str, bits: int | None) -> tuple[float | None, str]:
    """The quantized-KV rule's atol and how the report names it ((None, "") where none is
    measured: such a server is judged exact)."""
    atol = KV_QUANT_ATOL.get((library, model_type, bits)) if bits is not None else None
    if atol is None:
        return None, ""
    return atol, (
        f"{library} {model_type} --kv-bits {bits}: a warm request attends its quantized prefix "
        f"with every suffix position, a cold one with its last only; atol {atol:g} on every "
        "step's logprobs, greedy tokens equal (benchmarks/kv_quant_tolerance.py)"
    )


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
    ("mlx-vlm", "gemma4"): 2e-4,  # 1.72e-5 measured (results/gemma4/)
    ("mlx-lm", "gemma4_text"): 2e-4,  # 1.72e-5 measured (results/gemma4/)
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


#: A server's program (a module, a console script, the module of the ``MODULE:FUNC`` the logit
#: tap runs) -> the library whose model code computes its logits: the rule's first key.
LIBRARIES: dict[str, str] = {
    "mlx_lm.server": "mlx-lm",
    "mlx_lm": "mlx-lm",
    "mlx_vlm.server": "mlx-vlm",
    "mlx_vlm.server.cli": "mlx-vlm",
    "mlx_vlm": "mlx-vlm",
}


@dataclass(frozen=True)
class Identity:
    """What a rule is looked up by, and where each half was read."""

    library: str
    """``"mlx-lm"``, ``"mlx-vlm"``, or "" (not an MLX library's server, or not known)."""
    model_type: str
    """The model directory's config.json ``model_type`` ("" when unreadable)."""
    how: str
    """Where the two were read, for the report."""


def _words(cmd: str | Sequence[str]) -> list[str]:
    return shlex.split(cmd) if isinstance(cmd, str) else [str(w) for w in cmd]


def program_of(cmd: str | Sequence[str]) -> str:
    """The first word of a server command that names a program of :data:`LIBRARIES` ("" when
    none does): ``{python} -m pytest_prefixcache.tap mlx_lm.server:main ...`` ->
    ``mlx_lm.server``."""
    for word in _words(cmd):
        name = os.path.basename(word).split(":", 1)[0]
        if name in LIBRARIES:
            return name
    return ""


def model_dir_of(cmd: str | Sequence[str]) -> str:
    """The value of a server command's ``--model`` ("" when it has none)."""
    words = _words(cmd)
    for i, word in enumerate(words):
        if word == "--model" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--model="):
            return word.split("=", 1)[1]
    return ""


def identify(
    cmd: str | Sequence[str] | None = None,
    *,
    library: str | None = None,
    model_dir: str | os.PathLike[str] | None = None,
) -> Identity:
    """The library and model family of a server: ``library`` when the caller knows it (the
    seed engines, whose program is not the library's), else the command's program;
    ``model_dir`` when given, else the command's ``--model``."""
    parts = []
    program = program_of(cmd) if cmd is not None else ""
    if library is None:
        library = LIBRARIES.get(program, "")
        if program:
            parts.append(f"the server command runs {program}")
    else:
        parts.append(f"the engine runs {library}")
    model = str(model_dir) if model_dir else (model_dir_of(cmd) if cmd is not None else "")
    kind = model_type_of(model) if model else ""
    if kind:
        parts.append(f"model_type {kind} in {Path(model) / 'config.json'}")
    return Identity(library, kind, " and ".join(parts))


@dataclass(frozen=True)
class Rules:
    """The measured rules that apply to one engine on one model family."""

    identity: Identity
    atol: float | None
    """The split rule (every request; None: exact)."""
    rule: str
    decode_atol: float | None
    """The decode rule, where it allows more than the split rule (None: nothing more)."""
    decode_rule: str

    def named(self, rule: str) -> str:
        """``rule`` with where its keys were read."""
        return f"{rule}; identified from {self.identity.how}" if rule else ""


def rules_for(identity: Identity) -> Rules:
    """The split and decode rules of ``identity``'s library on its family."""
    lib, kind = identity.library, identity.model_type
    atol, decode = split_atol(lib, kind), decode_atol(lib, kind)
    if decode is not None and atol is not None and decode <= atol:
        decode = None  # the split rule, on every request, already allows it
    return Rules(
        identity, atol, split_rule(lib, kind), decode, decode_rule(lib, kind) if decode else ""
    )


def with_measured_rules(
    engine: _E,
    cmd: str | Sequence[str] | None = None,
    *,
    library: str | None = None,
    model_dir: str | os.PathLike[str] | None = None,
) -> _E:
    """``engine`` with the measured rules of the server ``cmd`` runs (:func:`identify`): its
    ``atol`` and ``tolerance_rule`` (the split rule), its ``decode_atol`` and ``decode_rule``.
    Every door (a preset, ``presets.from_env``, ``--prefixcache-server-cmd``, ``prefixcache
    verify --server-cmd``) builds its engine through this, so one server on one model is
    judged by one rule, named the same way."""
    rules = rules_for(identify(cmd, library=library, model_dir=model_dir))
    if rules.atol is not None:
        engine.atol = rules.atol
        engine.tolerance_rule = rules.named(rules.rule)
    bits = kv_bits_of(cmd) if cmd is not None else None
    kv_atol, kv_rule = kv_quant_rule(rules.identity.library, rules.identity.model_type, bits)
    if kv_atol is not None and kv_atol > (rules.atol or 0.0):
        engine.atol = kv_atol
        engine.tolerance_rule = rules.named(kv_rule)
    if rules.decode_atol is not None:
        engine.decode_atol = rules.decode_atol
        engine.decode_rule = rules.named(rules.decode_rule)
    return engine
