"""Mutants of the layers that cannot be trimmed: sliding windows (bug class 16) and recurrent
states (bug class 17). Each builds on a model with such layers (``Mutant.model``): on a
full-attention model there is nothing for them to break."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from pytest_prefixcache.types import Request

from ..blocks import BlockKey
from ..engine import Engine
from ..pool import Reuse
from ..render import Rendered
from ..snapshots import Snapshot, take_snapshot

__all__ = [
    "LayersOutOfStep",
    "RecurrentTrimmed",
    "RingTrimmedAfterWrap",
    "SlotNotReset",
    "SnapshotIncludesOutput",
    "SnapshotOffByOne",
]


class _TrimsLastCache(Engine):
    """Keeps the last cached request's whole cache (prompt and generated tokens, as a
    single-slot server does, one slot per namespace) and, on the next request of the same
    namespace, trims every layer back to the prefix they share, as if every layer were
    trimmable."""

    _last: dict[str, tuple[tuple[int, ...], list[Any]]]
    _namespace = ""

    def resume_point(
        self, reuse: Reuse, rendered: Rendered, keys: Sequence[BlockKey], request: Request
    ) -> Reuse:
        self.pool.release(reuse.held)
        last = self._slots().get(request.namespace)
        if last is None:
            return Reuse()
        ids, _cache = last
        shared = 0
        limit = min(len(ids), len(rendered.token_ids) - 1)
        while shared < limit and ids[shared] == rendered.token_ids[shared]:
            shared += 1
        return Reuse([], shared)

    def restore(self, reuse: Reuse, capacity: int) -> list[Any]:
        last = self._slots().pop(self._namespace, None) if reuse.tokens else None
        if last is None:
            return super().restore(Reuse(), capacity)
        ids, cache = last
        for kind, c in zip(self.model.kinds, cache):
            if kind != "recurrent":  # BUG: a ring is trimmed as if it were linear; a
                c.trim(len(ids) - reuse.tokens)  # recurrent state is not rewound at all
        return cache

    def _slots(self) -> dict[str, tuple[tuple[int, ...], list[Any]]]:
        if not hasattr(self, "_last"):
            self._last = {}
        return self._last

    def decode(
        self, logits: mx.array, cache: list[Any], prompt_len: int, delta: int, max_new: int
    ) -> tuple[tuple[int, ...], list[np.ndarray]]:
        tokens, steps = super().decode(logits, cache, prompt_len, delta, max_new)
        if self._serving_cached:
            # what the cache holds: the prompt and the generated tokens but the last
            self._slots()[self._namespace] = (self._ids + tokens[:-1], cache)
        return tokens, steps

    def reset(self) -> None:
        super().reset()
        self._slots().clear()

    def _serve(self, request: Request, rendered: Rendered, *args: Any, **kwargs: Any) -> Any:
        self._serving_cached = bool(args[-1] if args else kwargs.get("use_cache"))
        self._ids = rendered.token_ids
        self._namespace = request.namespace
        return super()._serve(request, rendered, *args, **kwargs)


class RingTrimmedAfterWrap(_TrimsLastCache):
    """A sliding-window layer's ring trimmed back as if it were a linear cache, after it has
    wrapped: the positions the trim should bring back were overwritten, and the ring's order is
    scrambled. Reproduces waybarrios/vllm-mlx #678 and 09cc64e, ml-explore/mlx-lm #1494 and
    #1437, Blaizzy/mlx-vlm #1715.
    """


class RecurrentTrimmed(_TrimsLastCache):
    """A recurrent layer's cache claims to be trimmable: the next request resumes at the shared
    prefix with a state that still holds everything after it (the rest of the previous prompt
    and its reply). Reproduces ml-explore/mlx-lm #980 and #1253, Rapid-MLX #1025.
    """


class SnapshotIncludesOutput(Engine):
    """The snapshot at a prompt's end is taken after decoding, so it holds the generated
    tokens too, under the key of the prompt alone. Reproduces the hybrid form of
    waybarrios/vllm-mlx #90 (review) and e846727, jundot/omlx #825.
    """

    _pending: tuple[Sequence[BlockKey], Rendered, Request, int] | None = None

    def snapshot(
        self,
        cache: list[Any],
        keys: Sequence[BlockKey],
        rendered: Rendered,
        request: Request,
        position: int,
    ) -> None:
        if position == len(rendered.token_ids):  # deferred until decoding is done
            self._pending = (keys, rendered, request, position)
            return
        super().snapshot(cache, keys, rendered, request, position)

    def decode(
        self, logits: mx.array, cache: list[Any], prompt_len: int, delta: int, max_new: int
    ) -> tuple[tuple[int, ...], list[np.ndarray]]:
        out = super().decode(logits, cache, prompt_len, delta, max_new)
        pending, self._pending = self._pending, None
        if pending is not None:  # BUG: the state after the reply, keyed by the prompt
            super().snapshot(cache, *pending)
        return out


class SnapshotOffByOne(Engine):
    """A snapshot labelled one position early: the state after position p is stored as the
    state after p - 1, so a request resuming there feeds token p - 1 a second time into the
    recurrent state. Reproduces ROCm/ATOM #1771's off-by-one slot offset and
    waybarrios/vllm-mlx #311.
    """

    def snapshot(
        self,
        cache: list[Any],
        keys: Sequence[BlockKey],
        rendered: Rendered,
        request: Request,
        position: int,
    ) -> None:
        snap = take_snapshot(cache, self.model.stateful_layers, position)
        snap.position = position - 1  # BUG: the key is right, the position it claims is not
        entry = self.pool.insert(self.snapshot_key(keys, rendered, request, position), snap, 1)
        if entry is not None:
            self.pool.release([entry])


class SlotNotReset(Engine):
    """A recurrent state slot handed to the next request without a full reset: restoring a
    snapshot into the slot writes the recurrent state but leaves the previous owner's
    convolution window (the last tokens it saw) in place. Reproduces ROCm/ATOM #1771 and
    Rapid-MLX #1058 and #1737.
    """

    _slot: Snapshot | None = None

    def restore(self, reuse: Reuse, capacity: int) -> list[Any]:
        cache = super().restore(reuse, capacity)
        if reuse.snapshot is not None and self._slot is not None:
            for i, state in self._slot.layers.items():
                conv = state.arrays[0]
                if conv is not None:  # BUG: the previous owner's conv window stays
                    cache[i].cache[0] = mx.array(conv)
        return cache

    def decode(
        self, logits: mx.array, cache: list[Any], prompt_len: int, delta: int, max_new: int
    ) -> tuple[tuple[int, ...], list[np.ndarray]]:
        out = super().decode(logits, cache, prompt_len, delta, max_new)
        recurrent = [i for i, k in enumerate(self.model.kinds) if k == "recurrent"]
        self._slot = take_snapshot(cache, recurrent, 0)
        return out


class LayersOutOfStep(Engine):
    """The full-attention layers resume at the whole matched prefix while the sliding-window
    layers resume from the last snapshot before it: the layers are out of step (a global layer
    trimmed while a sliding one could not be). Reproduces ml-explore/mlx-lm #1502 and #1776,
    ROCm/ATOM #1423.
    """

    def resume_point(
        self, reuse: Reuse, rendered: Rendered, keys: Sequence[BlockKey], request: Request
    ) -> Reuse:
        more = [self.pool.acquire(b.key) for b in reuse.blocks]  # kept past the snapshot
        found = super().resume_point(reuse, rendered, keys, request)
        self.pool.release(found.blocks)
        blocks = [b for b in more if b is not None]
        return Reuse(blocks, reuse.tokens if blocks else 0, found.snapshot)  # BUG
