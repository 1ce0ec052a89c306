"""Mutants of what a stored block holds: classes 7, 8, 9 and 15 of the bug zoo.

The keys are right; the KV rows stored, restored or computed under them are not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..blocks import BlockKey
from ..engine import Engine
from ..kv import Segment, Window, copy_segment
from ..pool import Block, Reuse

__all__ = [
    "AliasedLiveCache",
    "EmptySuffixRefeed",
    "MropeRestart",
    "SnapshotAfterDecode",
    "SnapshotBeforePrefill",
]


@dataclass
class _Rows:
    """A stand-in for a KVCache layer: just the ``keys`` and ``values`` buffers."""

    keys: mx.array
    values: mx.array


def _zero_from(buf: mx.array, cut: int) -> mx.array:
    return mx.concatenate([buf[:, :, :cut], mx.zeros_like(buf[:, :, cut:])], axis=2)


class SnapshotBeforePrefill(Engine):
    """Class 7, key does not match contents: the snapshot is taken BEFORE the suffix is
    prefilled and stored under the full prompt's keys.

    Rows past the restored prefix had not been written yet (a fresh KV buffer is zeros), so
    every newly stored block holds zero keys and values; the next hit attends to them.
    Reproduces the waybarrios/vllm-mlx #90 review finding (cache saved before prefill).
    """

    def store(self, cache: list[Any], keys: Sequence[BlockKey], first: int) -> None:
        cut = first * self.block_size
        # BUG: the rows as they were before prefill: nothing past the restored prefix yet.
        before = [_Rows(_zero_from(c.keys, cut), _zero_from(c.values, cut)) for c in cache]
        super().store(before, keys, first)


class SnapshotAfterDecode(Engine):
    """Class 7, key does not match contents: the snapshot is cut after decoding started,
    so the last stored block holds one row more than its key covers
    (``prompt_len=5, cache_offset=6``).

    A later hit restores that extra row (the next prompt token's or the first generated
    token's KV): every later position attends to a stale row and RoPE positions are off by
    one. Reproduces waybarrios/vllm-mlx e846727 and #311.
    """

    def store(self, cache: list[Any], keys: Sequence[BlockKey], first: int) -> None:
        stored: list[Block] = []
        whole = [k for k in keys if len(k.tokens) == self.block_size]
        try:
            for key in keys[first:]:
                start = key.index * self.block_size
                # BUG: the chain's last whole block is cut at the cache offset after one
                # decode step.
                end = start + len(key.tokens) + (1 if whole and key is whole[-1] else 0)
                rows = copy_segment(cache, start, end).window(0, end - start)
                block = self.pool.insert(key, rows, rows.nbytes)
                if block is None:
                    break
                stored.append(block)
        finally:
            self.pool.touch(stored)
            self.pool.release(stored)


class EmptySuffixRefeed(Engine):
    """Class 8, exact match with an empty suffix: the whole prompt matches, and the "fix"
    for the empty suffix feeds the last token again without rewinding the cache.

    Token-granular cache (``block_size=1``, like a prefix trie): an exact repeat matches
    every token; the engine computes the last token once more on top of the restored KV of
    the whole prompt, which already holds that token, so its logits are wrong. Reproduces
    waybarrios/vllm-mlx #3 (``[]`` is falsy: whole prompt reprocessed) and e846727 (the last
    token re-fed without trimming the cache).
    """

    def lookup(self, keys: Sequence[BlockKey], prompt_len: int) -> Reuse:
        hits = self.pool.lookup(keys)
        # an exact repeat keeps every block, the last one's row included; all tokens but
        # the last count as reused, and the last is computed again
        return Reuse(hits, min(len(hits) * self.block_size, prompt_len - 1))

    def restore(self, reuse: Reuse, capacity: int) -> list[Any]:
        rows = len(reuse.blocks) * self.block_size
        if rows > reuse.tokens:
            # BUG: the last token is recomputed, but the cache is not trimmed before it.
            return self.kv.restore([b.payload for b in reuse.blocks], rows, capacity)
        return super().restore(reuse, capacity)


@dataclass(frozen=True)
class _LiveRows:
    """A stored block that is a window on a live, still-growing KV cache (no copy)."""

    cache: list[Any]
    start: int
    end: int

    def rows(self) -> list[tuple[mx.array, mx.array]]:
        s, e = self.start, self.end
        return [(c.keys[:, :, s:e, :], c.values[:, :, s:e, :]) for c in self.cache]

    def window(self) -> Window:
        """The rows as the cache holds them NOW, as a block payload ``restore`` takes."""
        return Segment(self.rows(), self.end - self.start).window(0, self.end - self.start)


class AliasedLiveCache(Engine):
    """Class 9, aliasing: a stored entry is the live KV cache object, not a copy.

    A later hit on a chain stored from one cache is handed that cache itself, trimmed to the
    reused length; its prefill and decode write in place (MLX KV caches update their buffers
    with slice assignment) over rows that other stored blocks still point at, so those blocks
    now hold another request's KV. Reproduces waybarrios/vllm-mlx #576, #384 and #642.
    """

    def store(self, cache: list[Any], keys: Sequence[BlockKey], first: int) -> None:
        stored: list[Block] = []
        try:
            for key in keys[first:]:
                start = key.index * self.block_size
                # BUG: the block is a window on the live cache, not a copy of its rows.
                live = _LiveRows(cache, start, start + len(key.tokens))
                nbytes = sum(k.nbytes + v.nbytes for k, v in live.rows())
                block = self.pool.insert(key, live, nbytes)
                if block is None:
                    break
                stored.append(block)
        finally:
            self.pool.touch(stored)
            self.pool.release(stored)

    def restore(self, reuse: Reuse, capacity: int) -> list[Any]:
        live = [b.payload for b in reuse.blocks]
        if live and all(p.cache is live[0].cache for p in live):
            cache = live[0].cache
            # BUG: the stored cache itself is reused, trimmed to the hit: writes land in it.
            for c in cache:
                c.trim(c.size() - reuse.tokens)
            return cache
        return self.kv.restore([p.window() for p in live], reuse.tokens, capacity)


class MropeRestart(Engine):
    """Class 15, M-RoPE positions after a cached prefix: the suffix's position ids restart
    from the cache offset as plain text positions, without the rope delta of the images.

    Qwen2-VL gives an image's placeholders 2-D positions and advances text positions by the
    image's grid, not its token count; after a cached prefix with (or before) an image the
    suffix gets the wrong positions. Reproduces jundot/omlx #531, #131 and #881,
    waybarrios/vllm-mlx #386, sglang #5349 and #5455.
    """

    def prefill(
        self,
        ids: Sequence[int],
        start: int,
        embeds: mx.array,
        cache: list[Any],
        positions: mx.array | None,
        **hooks: Any,
    ) -> mx.array:
        if start > 0:
            # BUG: positions continue from the cache offset, ignoring the rope delta.
            n = len(ids)
            positions = mx.broadcast_to(mx.arange(n, dtype=mx.int32)[None, None, :], (3, 1, n))
        return super().prefill(ids, start, embeds, cache, positions, **hooks)
