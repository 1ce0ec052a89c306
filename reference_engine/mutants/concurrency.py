"""Concurrency mutants: class 10 of the bug zoo, bugs that live only among requests in flight.

The reference engine serves up to ``max_concurrency`` requests at once (``Engine.run``: they
interleave by phase, decode steps included), so these bugs are real races, not simulations:
each is harmless while one request is served at a time (the stream property cannot see it)
and shows under the waves property (``test_waves``), where a reply differs from the same
request served alone, cold.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..blocks import BlockKey
from ..engine import Engine
from ..model import LoadedModel
from ..pool import Block, BlockPool, Reuse

__all__ = ["EvictInUse", "RaggedBatch", "RaggedDecode", "ReadBeforeWrite", "WrongBatchRow"]


def _rows(cache: list[Any], layers: Sequence[int]) -> int:
    """The rows a cache holds (its full-attention layers' offset)."""
    return int(getattr(cache[layers[0]], "offset", 0)) if layers else 0


class WrongBatchRow(Engine):
    """Class 10, concurrency: the KV stored under a request's keys is read from another row
    of the batch, the cache of another request in flight (one decoding meanwhile), for the
    positions that row holds.

    A later hit on those blocks gets the other request's KV. Reproduces
    ml-explore/mlx-lm 23af8570 (#976: the prompt cache of the wrong batch row was saved) and
    jundot/omlx a74d499 (a late-bound generator stored another request's cache).
    """

    def __init__(self, model: LoadedModel, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self._live: dict[int, list[Any]] = {}
        """The cache of each request in flight, by thread: the rows of the batch."""

    def run(self, request: Any, *, use_cache: bool = True, template: bool = True) -> Any:
        try:
            return super().run(request, use_cache=use_cache, template=template)
        finally:
            self._live.pop(threading.get_ident(), None)

    def restore(self, reuse: Reuse, capacity: int) -> list[Any]:
        cache = super().restore(reuse, capacity)
        self._live[threading.get_ident()] = cache
        return cache

    def store(self, cache: list[Any], keys: Sequence[BlockKey], first: int) -> None:
        me = threading.get_ident()
        others = [c for t, c in list(self._live.items()) if t != me]
        if not others:
            super().store(cache, keys, first)
            return
        # BUG: the rows come from the other batch row, for every whole block it holds.
        held = _rows(others[0], self.model.full_layers) // self.block_size
        split = max(first, min(held, len(keys)))
        if split > first:
            super().store(others[0], keys[:split], first)
        super().store(cache, keys, split)

    def reset(self) -> None:
        super().reset()
        self._live.clear()


class ReadBeforeWrite(Engine):
    """Class 10, concurrency: at admission a request publishes the blocks it is about to
    compute, before it has written them (their rows are still zeros), and replaces them with
    the real rows when it stores. Alone, nobody looks in between; a request admitted
    meanwhile reuses the unwritten blocks (instead of waiting for their writer).

    Reproduces the read-before-write races of paged caches that publish a block's hash when
    it is allocated, not when its prefill has written it (vllm-project/vllm #3944) and
    waybarrios/vllm-mlx #3 (a cache entry visible before it was filled).
    """

    def __init__(self, model: LoadedModel, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self._reserved: dict[int, list[Block]] = {}
        self._shapes: list[tuple[tuple[int, ...], tuple[int, ...], Any]] = []

    def admit(
        self, keys: Sequence[BlockKey], rendered: Any, request: Any, *, use_cache: bool
    ) -> tuple[int | None, Reuse, list[bytes]]:
        served, reuse, writing = super().admit(keys, rendered, request, use_cache=use_cache)
        first = reuse.tokens // self.block_size  # the first block it will store
        todo = [k for k in keys[first:] if len(k.tokens) == self.block_size]
        if use_cache and todo and self._shapes:
            # BUG: the blocks are published now, with rows the prefill has not written.
            with self._compute:
                zeros = [_Unwritten(k, v, d, len(rendered.token_ids)) for k, v, d in self._shapes]
                before = {id(b) for b in self.pool.blocks()}
                self.kv.store(self.pool, zeros, todo, block_size=self.block_size)
                self._reserved[threading.get_ident()] = [
                    b for b in self.pool.blocks() if id(b) not in before
                ]
        return served, reuse, writing

    def store(self, cache: list[Any], keys: Sequence[BlockKey], first: int) -> None:
        pool = self.pool
        with pool._lock:  # the real rows replace the unwritten ones
            for block in self._reserved.pop(threading.get_ident(), []):
                if pool._blocks.get(block.key.digest) is block:
                    pool._drop(block.key.digest)
        if not self._shapes:
            self._shapes = [
                (cache[i].keys.shape, cache[i].values.shape, cache[i].keys.dtype)
                for i in self.model.full_layers
            ]
        super().store(cache, keys, first)

    def reset(self) -> None:
        super().reset()
        self._reserved.clear()


class _Unwritten:
    """A layer whose buffers hold ``rows`` positions nobody wrote yet (zeros)."""

    def __init__(self, kshape: Any, vshape: Any, dtype: Any, rows: int) -> None:
        import mlx.core as mx

        self.keys = mx.zeros((*kshape[:2], rows, kshape[3]), dtype)
        self.values = mx.zeros((*vshape[:2], rows, vshape[3]), dtype)


class _HolderBlindPool(BlockPool):
    """A pool that, short of room, evicts blocks other requests in flight still hold."""

    def __init__(self, max_bytes: int, on_drop: Any = None) -> None:
        super().__init__(max_bytes, on_drop)
        self._held: dict[int, set[int]] = {}
        self._recycled: list[Block] = []

    def reuse(self, keys: Sequence[BlockKey], prompt_len: int, **kw: Any) -> Reuse:
        found = super().reuse(keys, prompt_len, **kw)
        self._held.setdefault(threading.get_ident(), set()).update(id(b) for b in found.blocks)
        return found

    def release(self, blocks: Any) -> None:
        blocks = list(blocks)
        mine = self._held.get(threading.get_ident(), set())
        mine.difference_update(id(b) for b in blocks)
        super().release(blocks)

    def _make_room(self, nbytes: int) -> bool:
        mine = self._held.get(threading.get_ident(), set())
        for digest, block in list(self._blocks.items()):
            if self._bytes + nbytes <= self.max_bytes:
                break
            if block.refcount == 0 or id(block) not in mine:
                # BUG: "in use" is asked of this request only: a block another request in
                # flight holds is evicted, and its memory goes to the next new block.
                self._drop(digest)
                self.stats.evictions += 1
                if block.refcount:
                    self._recycled.append(block)
        return self._bytes + nbytes <= self.max_bytes

    def insert(self, key: BlockKey, payload: Any, nbytes: int) -> Block | None:
        block = super().insert(key, payload, nbytes)
        if block is not None:  # acquired for the storing request: in use by it
            self._held.setdefault(threading.get_ident(), set()).add(id(block))
        if block is not None and block.payload is payload:
            for i, old in enumerate(self._recycled):
                if old.payload.rows == payload.rows:  # its slot now holds the new rows
                    slot = self._recycled.pop(i).payload
                    slot.segment, slot.offset = payload.segment, payload.offset
                    break
        return block

    def clear(self) -> None:
        super().clear()
        self._recycled.clear()


class EvictInUse(Engine):
    """Class 10, concurrency: under memory pressure, the pool asks whether a block is in use
    of the request storing, not of every request in flight; a block another request acquired
    at admission (and has not restored yet) is evicted and its memory reused, so that request
    restores another block's rows.

    Runs with a small pool (``SMALL_BUDGET``). Alone, the only blocks in use are the storing
    request's own: nothing shows. Reproduces waybarrios/vllm-mlx #541 and #683 (agents
    evicting each other's entries mid-request) under concurrency.
    """

    def __init__(self, model: LoadedModel, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.pool = _HolderBlindPool(self.pool.max_bytes, on_drop=self.kv.dropped)


class RaggedBatch(Engine):
    """Class 10, concurrency: cached requests in flight resume from prefixes of different
    lengths, their caches are merged into one batch left-padded to the longest (as
    mlx-lm's ``BatchKVCache.merge`` pads with zero rows), and the suffixes are prefilled
    without the padding mask: a shorter row's queries attend the zero rows before its prefix.
    Its reply and the blocks it stores (its real rows, the padding cut off) are wrong.

    Alone there is no padding, and cold requests resume from nothing (a batch of cold prefills
    is padded on the right, which a causal prefill never attends): the streams and the
    cache-off noise wave see nothing. Reproduces the missing ``left_padding`` mask of ragged
    batches (ml-explore/mlx-lm #1776's two requests with different histories in one batch;
    the masks ``BatchKVCache.make_mask`` builds from ``left_padding``).
    """

    def __init__(self, model: LoadedModel, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self._prefixes: dict[int, int] = {}
        """The reused prefix of each cached request in flight, by thread: the batch's rows."""
        self._padding: dict[int, int] = {}

    def run(self, request: Any, *, use_cache: bool = True, template: bool = True) -> Any:
        try:
            return super().run(request, use_cache=use_cache, template=template)
        finally:
            self._prefixes.pop(threading.get_ident(), None)
            self._padding.pop(threading.get_ident(), None)

    def admit(
        self, keys: Sequence[BlockKey], rendered: Any, request: Any, *, use_cache: bool
    ) -> tuple[int | None, Reuse, list[bytes]]:
        served, reuse, writing = super().admit(keys, rendered, request, use_cache=use_cache)
        if use_cache:
            self._prefixes[threading.get_ident()] = reuse.tokens
        return served, reuse, writing

    def restore(self, reuse: Reuse, capacity: int) -> list[Any]:
        import mlx.core as mx

        me = threading.get_ident()
        cache = super().restore(reuse, capacity)
        longest = max((n for t, n in list(self._prefixes.items()) if t != me), default=0)
        pad = longest - reuse.tokens
        if me not in self._prefixes or not reuse.tokens or pad <= 0:
            return cache
        # BUG: this row of the merged batch starts with ``pad`` zero rows, never masked.
        for layer in cache:
            if getattr(layer, "keys", None) is None:
                continue
            k, v = layer.keys, layer.values
            layer.keys = mx.concatenate([mx.zeros((*k.shape[:2], pad, k.shape[3]), k.dtype), k], 2)
            layer.values = mx.concatenate(
                [mx.zeros((*v.shape[:2], pad, v.shape[3]), v.dtype), v], 2
            )
            layer.offset += pad
        self._padding[me] = pad
        return cache

    def prefill(
        self,
        ids: Sequence[int],
        start: int,
        embeds: Any,
        cache: list[Any],
        positions: Any,
        **hooks: Any,
    ) -> Any:
        pad = self._padding.pop(threading.get_ident(), 0)
        if pad:  # the engine stores after the row is taken out of the batch, not meanwhile
            hooks.pop("at_last_chunk", None)
        logits = super().prefill(ids, start, embeds, cache, positions, **hooks)
        for layer in cache if pad else ():  # the row taken out of the batch: padding cut off
            if getattr(layer, "keys", None) is None:
                continue
            layer.keys, layer.values = layer.keys[..., pad:, :], layer.values[..., pad:, :]
            layer.offset -= pad
        return logits


class RaggedDecode(Engine):
    """Class 10, concurrency: the requests decoding at the same time form one batch, its
    rows aligned at their last position (left-padded to the longest), and every decode step
    takes its rotary position from the batch's length, not from the row's own (the padding
    is not subtracted). The first token, from the request's own prefill, is right; each
    token after it is computed at a wrong position in a row shorter than the longest.

    Alone, or as the longest row, there is no padding: the streams see nothing, and neither
    does a wave whose requests never decode side by side. A cold wave is batched the same way,
    so the cache-off wave already differs from the requests alone (a batching fault, not a
    cache one). It needs position ids (the Qwen-VL family of the default fixture). Reproduces
    the per-row offsets of ragged batches (mlx-lm's ``BatchKVCache`` keeps each row's
    ``offset`` as the batch's length minus its ``left_padding``; ml-explore/mlx-lm #1776's
    requests with different histories in one batch).
    """

    def __init__(self, model: LoadedModel, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self._decoding: dict[int, int] = {}
        """The position of the next decode step of each request decoding, by thread: the
        batch's rows."""

    def decode(
        self, logits: Any, cache: list[Any], prompt_len: int, delta: int, max_new: int
    ) -> tuple[tuple[int, ...], list[np.ndarray]]:
        me = threading.get_ident()
        m = self.model
        steps = [np.array(logits)]
        tokens: list[int] = []
        try:
            for i in range(max_new):
                token = int(np.argmax(steps[-1]))
                tokens.append(token)
                if token in m.eos_token_ids or i == max_new - 1:
                    break
                self._decoding[me] = prompt_len + i
                self.interleave()  # the other rows of the batch take their step
                # BUG: the batch's length (its longest row), not this row's own position
                position = max(self._decoding.values())
                pos = m.family.step_positions(position + delta)
                steps.append(np.array(m.forward([token], m.embed([token]), cache, pos)))
        finally:
            self._decoding.pop(me, None)
        return tuple(tokens), steps

    def reset(self) -> None:
        super().reset()
        self._decoding.clear()
