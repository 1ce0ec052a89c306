"""Mutants of the quantized-KV mode (``reference_engine/kvquant.py``): class 18 of the bug zoo.

Each overrides one step of :class:`~reference_engine.kvquant.QuantizedKV`: what names the
setting in the cache key (``kv_key``), or which positions a request's cache quantizes
(``quantize_cache``). The rows, the prefill and the lookup are the correct engine's.
"""

from __future__ import annotations

from typing import Any

from ..engine import Engine
from ..kvquant import KVQuant, fake_quantize, install

__all__ = ["KvBitsNotKeyed", "KvStartOffByOneBlock", "SwitchingKV"]


class KvBitsNotKeyed(Engine):
    """Class 18, quantized KV: the cache key names the group size and the start, not the bits.

    Blocks stored at 8 bits are served after the engine switches to 4 bits (a setting changed
    on a running server, a cache saved and reloaded under other flags), so a warm request
    reads rows quantized at another width than its cold run. Reproduces the case mlx-lm's
    ``generate.py`` refuses ("--kv-bits does not match the kv cache loaded from
    --prompt-cache-file") and oMLX's runtime-switchable ``turboquant_kv_bits`` (jundot/omlx
    #705) opens, with the silently wrong answers of quantized caches in jundot/omlx #3690 and
    Blaizzy/mlx-vlm #1310.
    """

    def kv_key(self) -> tuple[str, ...]:
        q = self.kv_quant
        # BUG: the bits are left out of the key.
        return () if q is None else (f"kv:g{q.group_size}s{q.start}",)


class KvStartOffByOneBlock(Engine):
    """Class 18, quantized KV: a warm request takes the quantized start one block early.

    On a cache hit the engine counts the start in blocks and is off by one: it quantizes the
    rows from the block before the start's, the restored prefix's rows of that block
    included (a cache converted whole once restored, as ``maybe_quantize_kv_cache`` does),
    while its cold run keeps them in full precision. Only requests that hit the cache are
    wrong. Reproduces jundot/omlx #3690 (4-bit KV corrupts recall from the cached region only)
    and Blaizzy/mlx-vlm #1310 (the quantized-KV path with a wrong offset loses the prompt's
    context).
    """

    def quantize_cache(self, cache: list[Any], reused: int) -> list[Any]:
        q = self.kv_quant
        if q is None or reused == 0:
            return super().quantize_cache(cache, reused)
        # BUG: the start's block index, minus one, times the block size.
        early = max(0, (q.start // self.block_size - 1) * self.block_size)
        setting = KVQuant(q.bits, q.group_size, early)
        for i in self.model.full_layers:
            layer = cache[i]
            end = min(q.start, reused)
            if early < end:
                for name in ("keys", "values"):
                    buf = getattr(layer, name)
                    buf[:, :, early:end, :] = fake_quantize(
                        buf[:, :, early:end, :], q.bits, q.group_size
                    )
        install(cache, self.model.full_layers, setting)
        return cache


class SwitchingKV:
    """An engine whose KV setting switches around every cached request: the request is served
    under the engine's first setting (filling its cache), then again under ``then``, and that
    second outcome is returned; a cold request runs under ``then``. What a server whose KV
    bits change while its cache stays shows its clients (mlx-vlm's runtime ``kv_bits`` knob,
    ``mlx_vlm/server/runtime_config.py``). One request at a time: the setting is the engine's.

    Args:
        engine: the engine (its ``kv_quant`` is the first setting).
        then: the setting of the returned outcomes.
    """

    max_concurrency = 1

    def __init__(self, engine: Engine, then: KVQuant) -> None:
        self.engine = engine
        self.first = engine.kv_quant
        self.then = then

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def run(self, request: Any, *, use_cache: bool = True, **kw: Any) -> Any:
        if use_cache:
            self.engine.set_kv_quant(self.first)
            self.engine.run(request, use_cache=True, **kw)
        self.engine.set_kv_quant(self.then)
        return self.engine.run(request, use_cache=use_cache, **kw)
