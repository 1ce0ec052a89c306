"""Mutants of KV-shared layers (bug class 27): Gemma 4's last layers attend over the K/V of an
earlier layer of their type instead of projecting their own. Each builds on a model that has
such layers (``tiny-gemma4``): on any other there is nothing for them to break."""

from __future__ import annotations

import contextvars
from typing import Any

import mlx.core as mx

from pytest_prefixcache.errors import EngineError

from ..engine import Engine
from ..model import LoadedModel

__all__ = ["SharedKvSlotStale"]


class _Slot:
    """A KV-shared layer's own copy of its source's K/V, as an engine that allocates a KV slot
    per layer keeps it: written by every prefill and decode step, never restored."""

    def __init__(self) -> None:
        self.rows: tuple[mx.array, mx.array] | None = None  # from the last request
        self.read: tuple[mx.array, mx.array] | None = None  # this request's latest read
        self.start = 0  # the prefix positions this request restored from the cache

    def substitute(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.start and self.rows is not None:
            n = min(self.start, self.rows[0].shape[2], keys.shape[2])
            old_keys, old_values = self.rows
            # BUG: the restored prefix is read from the slot, which holds the last request's
            keys = mx.concatenate([old_keys[:, :, :n], keys[:, :, n:]], axis=2)
            values = mx.concatenate([old_values[:, :, :n], values[:, :, n:]], axis=2)
        self.read = (keys, values)
        return keys, values


_ACTIVE: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar("shared_slot", default=None)


class _SlotReader:
    """A KV-shared layer's attention, reading through the active slot (when a
    :class:`SharedKvSlotStale` engine is serving; as it is otherwise)."""

    def __init__(self, attention: Any) -> None:
        self.attention = attention

    def __call__(self, *args: Any, shared_kv: Any = None, **kwargs: Any) -> Any:
        slot = _ACTIVE.get()
        if slot is not None and shared_kv is not None:
            shared_kv = slot.substitute(*shared_kv)
        return self.attention(*args, shared_kv=shared_kv, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.attention, name)


def _install(model: LoadedModel) -> None:
    """Route the global KV-shared layers' attention through :class:`_SlotReader` (once)."""
    inner = model.model.language_model.model
    first = int(getattr(inner, "first_kv_shared_layer_idx", len(inner.layers)))
    shared = [
        layer
        for i, layer in enumerate(inner.layers)
        if i >= first and getattr(layer, "layer_type", "") == "full_attention"
    ]
    if not shared:
        raise EngineError(
            f"shared_kv_slot_stale needs a model with KV-shared full-attention layers "
            f"(Gemma 4); {str(model.path)!r} ({model.model_type}) has none"
        )
    for layer in shared:
        if not isinstance(layer.self_attn, _SlotReader):
            layer.self_attn = _SlotReader(layer.self_attn)


class SharedKvSlotStale(Engine):
    """The KV-shared layers read their own KV slot, which the prefix cache never restores: on a
    hit, the restored prefix positions come from whatever the last request left in the slot
    (its source layer's rows are restored, the copy the shared layers read is not); a cold run
    is right. Reproduces ggml-org/llama.cpp #24411 and waybarrios/vllm-mlx #775 (Gemma 4
    replies corrupted after cache reuse).
    """

    def __init__(self, model: LoadedModel, **options: Any) -> None:
        super().__init__(model, **options)
        _install(model)
        self._slot = _Slot()

    def _serve(self, *args: Any, **kwargs: Any) -> Any:
        reuse = args[4] if len(args) > 4 else kwargs["reuse"]
        self._slot.start = int(reuse.tokens)
        token = _ACTIVE.set(self._slot)
        try:
            return super()._serve(*args, **kwargs)
        finally:
            _ACTIVE.reset(token)
            if self._slot.read is not None:
                self._slot.rows, self._slot.read = self._slot.read, None
                mx.eval(list(self._slot.rows))

    def reset(self) -> None:
        super().reset()
        self._slot = _Slot()
