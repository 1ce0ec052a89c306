"""The reference engine's quantized-KV mode: mlx-lm's ``QuantizedKVCache`` scheme (affine
quantization of every KV row, group-wise over the head dimension, ``bits`` per value, from
position ``start`` on), chosen by ``Engine(kv_quant=...)``, ``reference_engine.server
--kv-bits/--kv-group-size/--quantized-kv-start`` or ``PREFIXCACHE_REFERENCE_KV_BITS``,
``_KV_GROUP_SIZE`` and ``_KV_START`` (mlx_lm.server's flags, by the same names).

Where it differs from mlx-lm, and why. mlx-lm converts a whole cache once its offset passes
``--quantized-kv-start`` (``maybe_quantize_kv_cache``, after a prefill chunk or a decode step),
so which rows a query reads quantized depends on where the prefill was split: a warm run,
whose prefix arrives as a cache already past the start, attends to quantized rows that its
cold run read in full precision. Here a row is quantized as it is written, iff its position is
``>= start``, and attention reads the stored rows: every row's value depends on its position
alone, cold or warm, chunked or not, so the engine stays bit-exact against its cold run
(``tests/test_kvquant.py``). Rows are quantized and dequantized at once (the arithmetic of
``mx.quantize``'s affine mode: per group, scale = (max - min) / (2**bits - 1), bias = min, in
float32), so attention runs MLX's ordinary kernel and the pool stores the dequantized rows
(no memory saving: the mode models the numerics and the keying, not the footprint). MLX's own
``mx.quantize`` needs groups of 32 or more; the fixtures' head dims are 16 and 32, so the group
size defaults to ``min(64, head dim)`` and may be any divisor of the head dim.

Only full-attention layers are quantized (mlx-lm: ``RotatingKVCache.to_quantized`` is not
implemented; recurrent states have none). The rows depend on ``bits``, ``group_size`` and
``start``, so all three are in the cache key (:meth:`QuantizedKV.kv_key`, a part of the
namespace root), and switching them (:meth:`QuantizedKV.set_kv_quant`) never reuses a row
stored under other settings.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from pytest_prefixcache.errors import EngineError

if TYPE_CHECKING:
    from .model import LoadedModel

__all__ = [
    "KV_BITS",
    "KV_ENV",
    "KVQuant",
    "QuantizedKV",
    "fake_quantize",
    "head_dim",
    "kv_quant_from_env",
]

#: The bit widths the mode accepts (mx.quantize's affine widths).
KV_BITS = (2, 3, 4, 5, 6, 8)
#: The environment variables, as mlx_lm.server's flags: bits (unset: off), group size, start.
KV_ENV = (
    "PREFIXCACHE_REFERENCE_KV_BITS",
    "PREFIXCACHE_REFERENCE_KV_GROUP_SIZE",
    "PREFIXCACHE_REFERENCE_KV_START",
)


@dataclass(frozen=True, order=True)
class KVQuant:
    """A quantized-KV setting: ``bits`` per value, groups of ``group_size`` values along the
    head dimension (0: ``min(64, head dim)``, fixed when the engine is built), rows at positions
    ``>= start`` quantized."""

    bits: int
    group_size: int = 0
    start: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or self.bits not in KV_BITS:
            raise EngineError(f"KV bits {self.bits!r} is not one of {KV_BITS}")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int):
            raise EngineError(f"KV group size {self.group_size!r} is not an int")
        if self.group_size < 0:
            raise EngineError(f"KV group size {self.group_size} is negative")
        if isinstance(self.start, bool) or not isinstance(self.start, int) or self.start < 0:
            raise EngineError(f"quantized KV start {self.start!r} is not an int >= 0")

    def for_head_dim(self, dim: int) -> KVQuant:
        """This setting with its group size fixed for a head dimension of ``dim``; an
        EngineError when the group does not divide it."""
        group = self.group_size or min(64, dim)
        if group <= 0 or dim % group:
            raise EngineError(
                f"KV group size {group} does not divide the model's head dimension {dim}"
            )
        return KVQuant(self.bits, group, self.start)

    @property
    def label(self) -> str:
        """How the setting is named in the cache key and in reports: ``q4g32s0``."""
        return f"q{self.bits}g{self.group_size}s{self.start}"


def _env_int(name: str, default: int | None) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise EngineError(f"{name}={value!r} is not an integer") from None


def kv_quant_from_env() -> KVQuant | None:
    """The setting ``PREFIXCACHE_REFERENCE_KV_BITS`` (unset or empty: off), ``_GROUP_SIZE``
    (default: 0, ``min(64, head dim)``) and ``_START`` (default: 0) name; an EngineError
    naming the variable when a value is wrong."""
    bits_env, group_env, start_env = KV_ENV
    bits = _env_int(bits_env, None)
    if bits is None:
        return None
    group = _env_int(group_env, 0)
    start = _env_int(start_env, 0)
    assert group is not None and start is not None
    try:
        return KVQuant(bits, group, start)
    except EngineError as exc:
        raise EngineError(f"{', '.join(KV_ENV)}: {exc}") from None


def fake_quantize(x: mx.array, bits: int, group_size: int) -> mx.array:
    """``x`` quantized to ``bits`` per value in groups of ``group_size`` along its last axis
    and dequantized (affine: per group, scale = (max - min) / (2**bits - 1), bias = min, in
    float32), in ``x``'s dtype. Each group depends on its own values only."""
    shape = x.shape
    g = x.astype(mx.float32).reshape(*shape[:-1], shape[-1] // group_size, group_size)
    lo = g.min(axis=-1, keepdims=True)
    hi = g.max(axis=-1, keepdims=True)
    levels = (1 << bits) - 1
    scale = (hi - lo) / levels
    safe = mx.where(scale > 0, scale, mx.ones_like(scale))
    q = mx.clip(mx.round((g - lo) / safe), 0, levels)
    return (q * scale + lo).reshape(shape).astype(x.dtype)


def quantize_from(x: mx.array, first: int, setting: KVQuant) -> mx.array:
    """Rows of ``x`` (batch, heads, rows, dim) at positions ``first``, ``first + 1``, ...
    quantized where the position is ``>= setting.start``."""
    cut = setting.start - first
    if cut >= x.shape[2]:
        return x
    if cut <= 0:
        return fake_quantize(x, setting.bits, setting.group_size)
    tail = fake_quantize(x[:, :, cut:, :], setting.bits, setting.group_size)
    return mx.concatenate([x[:, :, :cut, :], tail], axis=2)


def head_dim(model: LoadedModel) -> int:
    """The head dimension of the model's full-attention layers (from its config)."""
    config = model.model.config
    text = getattr(config, "text_config", None) or config

    def get(key: str) -> Any:
        return text.get(key) if isinstance(text, dict) else getattr(text, key, None)

    dim = get("head_dim") or int(get("hidden_size")) // int(get("num_attention_heads"))
    return int(dim)


class QuantizedKV:
    """The engine's quantized-KV steps (see the module): a part of
    :class:`~reference_engine.engine.Engine`, one step a method (a mutant breaks one)."""

    model: LoadedModel
    block_size: int
    kv_quant: KVQuant | None
    _lock: threading.RLock
    _roots: dict[tuple[str, str | None], bytes]

    def set_kv_quant(self, setting: KVQuant | None) -> None:
        """Quantize the KV of the requests that follow with ``setting`` (None: off), its group
        size fixed for the model; blocks stored under another setting stay, under their key."""
        fixed = None if setting is None else setting.for_head_dim(head_dim(self.model))
        with self._lock:
            self.kv_quant = fixed
            self._roots.clear()

    def kv_key(self) -> tuple[str, ...]:
        """The parts of the namespace root naming the setting (none when off: the keys of an
        unquantized engine are unchanged)."""
        return () if self.kv_quant is None else (f"kv:{self.kv_quant.label}",)

    def quantize_cache(self, cache: list[Any], reused: int) -> list[Any]:
        """Make the full-attention layers of a request's ``cache`` (``reused`` rows restored)
        quantize each row they are handed from ``kv_quant.start`` on, before storing it."""
        if self.kv_quant is not None:
            install(cache, self.model.full_layers, self.kv_quant)
        return cache


def install(cache: Sequence[Any], layers: Sequence[int], setting: KVQuant) -> None:
    """Wrap ``update_and_fetch`` of ``cache[i]`` for each ``i`` in ``layers``: new rows are
    quantized by position (``quantize_from``, the cache's offset being the first one's)."""
    for i in layers:
        layer = cache[i]
        inner = layer.update_and_fetch

        def update_and_fetch(
            keys: mx.array, values: mx.array, _inner: Any = inner, _layer: Any = layer
        ) -> Any:
            first = int(_layer.offset)
            keys, values = (quantize_from(x, first, setting) for x in (keys, values))
            return _inner(keys, values)

        layer.update_and_fetch = update_and_fetch
