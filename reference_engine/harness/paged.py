"""A paged KV store: the model's KV rows kept per physical block, addressed by a block table.

A paged engine's model runner reads the KV of a sequence's cached positions from the blocks
its block table names and writes the rows it computes into them. This store does the same on
CPU with MLX arrays, so that whatever block a block manager hands out is really read: a block
handed to two sequences at once, a freed block still indexed, or a hash that matches the wrong
content makes the model attend to wrong keys and values, and the logits show it.

Each block holds, per full-attention layer, keys and values of ``block_size`` rows
(``(1, kv heads, block_size, head dim)``), zero until written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from pytest_prefixcache.errors import EngineError

from ..kv import Segment, Window

__all__ = ["PagedKV"]


class PagedKV:
    """``num_blocks`` physical blocks of ``block_size`` KV rows each.

    Args:
        num_blocks: how many blocks the block manager may hand out (ids 0 .. num_blocks - 1).
        block_size: rows per block.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._blocks: dict[int, Segment] = {}
        #: Rows written per block since the start (for inspection).
        self.writes = 0

    def _check(self, table: Sequence[int], end: int, who: str) -> None:
        needed = -(-end // self.block_size)
        if len(table) < needed:
            raise EngineError(
                f"{who}: the block table has {len(table)} blocks ({list(table)}) for "
                f"{end} positions (block size {self.block_size}: {needed} needed)"
            )
        for b in table[:needed]:
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < self.num_blocks:
                raise EngineError(
                    f"{who}: block id {b!r} in the block table {list(table)} is not one of "
                    f"0..{self.num_blocks - 1}"
                )

    def windows(self, table: Sequence[int], tokens: int) -> list[Window]:
        """Windows on the blocks holding positions [0, tokens) in table order (a block never
        written reads as zeros: that is what a GPU engine's uninitialised block holds)."""
        if tokens <= 0:
            return []
        self._check(table, tokens, "reading the cached prefix")
        out = []
        for i in range(-(-tokens // self.block_size)):
            seg = self._blocks.get(table[i])
            if seg is None:
                raise EngineError(
                    f"reading the cached prefix: block {table[i]} (position {i * self.block_size}"
                    f" of the block table {list(table)}) was never written"
                )
            rows = min(self.block_size, tokens - i * self.block_size)
            out.append(seg.window(0, rows))
        return out

    def write(self, table: Sequence[int], cache: Sequence[Any], start: int, end: int) -> None:
        """Copy the rows [start, end) of every layer of ``cache`` (KVCache layers holding at
        least ``end`` positions) into the blocks the table names for those positions."""
        if end <= start:
            return
        self._check(table, end, "writing computed KV")
        bs = self.block_size
        pending = []
        for i in range(start // bs, -(-end // bs)):
            a, b = max(start, i * bs), min(end, (i + 1) * bs)
            o = a - i * bs
            seg = self._blocks.get(table[i])
            layers = []
            for layer, c in enumerate(cache):
                k_new = c.keys[:, :, a:b, :]
                v_new = c.values[:, :, a:b, :]
                if seg is None:
                    k = mx.zeros((*k_new.shape[:2], bs, k_new.shape[3]), k_new.dtype)
                    v = mx.zeros((*v_new.shape[:2], bs, v_new.shape[3]), v_new.dtype)
                else:
                    k, v = (mx.array(x) for x in seg.layers[layer])
                k[:, :, o : o + (b - a), :] = k_new
                v[:, :, o : o + (b - a), :] = v_new
                layers.append((k, v))
            self._blocks[table[i]] = Segment(layers, bs)
            pending.append(layers)
            self.writes += b - a
        mx.eval(pending)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._blocks.values())

    def __len__(self) -> int:
        return len(self._blocks)
