"""The block pool: stored KV blocks by chained key, reference counts, LRU under a byte budget.

The pool knows nothing of MLX: a block's payload is opaque and its size is given by the
caller. A block that is referenced (acquired by a running request) is never evicted. A hit
is confirmed against the stored parent, token ids and extra keys, never the hash alone.

``reuse`` is the one place that decides how much of a prompt is reused: the chain of whole
blocks, then, among the stored children of the chain's last block, the one whose leading rows
are valid for the next block of the prompt for the most positions (``agreeing_prefix``:
reuse at token granularity), capped so that at least one token is computed. A stored partial
block (a prompt's tail) that a newer child of the same parent fully covers is dropped when
unreferenced (``superseded``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .blocks import BlockKey, agreeing_prefix

__all__ = ["Block", "BlockPool", "PoolStats", "Reuse"]


@dataclass(eq=False)
class Block:
    """One stored block: its key, its payload (the KV rows) and its bookkeeping."""

    key: BlockKey
    payload: Any
    nbytes: int
    refcount: int = 0
    superseded: bool = False
    """Covered by a longer sibling: dropped as soon as nothing references it."""

    def matches(self, key: BlockKey) -> bool:
        return (
            self.key.parent == key.parent
            and self.key.tokens == key.tokens
            and self.key.extras == key.extras
        )


@dataclass
class Reuse:
    """What a lookup acquired: blocks in chain order (block i at index i), and how many
    leading tokens they give: every row of each block but the last, a prefix of the last's."""

    blocks: list[Block] = field(default_factory=list)
    tokens: int = 0
    snapshot: Block | None = None
    """The snapshot the non-trimmable layers resume from (``snapshots.py``), if any."""

    @property
    def held(self) -> list[Block]:
        """Everything this reuse references: its blocks and its snapshot."""
        return [*self.blocks, *([self.snapshot] if self.snapshot is not None else [])]


@dataclass
class PoolStats:
    """Counters since the last reset."""

    lookups: int = 0
    hit_blocks: int = 0
    stored_blocks: int = 0
    evictions: int = 0
    collisions: int = 0
    rejected: int = 0
    partial_hits: int = 0
    superseded: int = 0
    resident_bytes: int = 0
    resident_blocks: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class BlockPool:
    """Blocks keyed by chained digest, evicted least recently used first under ``max_bytes``.

    ``on_drop`` is called with the payload of every block the pool lets go of (evicted,
    superseded or cleared), so that its owner can free what the payload shares.
    """

    def __init__(self, max_bytes: int, on_drop: Callable[[Any], None] | None = None) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.on_drop = on_drop
        self._blocks: OrderedDict[bytes, Block] = OrderedDict()
        self._children: dict[bytes, dict[bytes, None]] = {}  # parent -> child digests
        self._bytes = 0
        self._lock = threading.RLock()
        self.stats = PoolStats()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._blocks

    @property
    def resident_bytes(self) -> int:
        return self._bytes

    def blocks(self) -> list[Block]:
        """A snapshot of the stored blocks, least recently used first."""
        with self._lock:
            return list(self._blocks.values())

    def reuse(
        self, keys: Sequence[BlockKey], prompt_len: int, *, block_size: int, partial: bool = True
    ) -> Reuse:
        """Acquire what a prompt of ``prompt_len`` tokens cut into ``keys`` reuses: the
        longest stored chain of whole blocks, then (``partial``) the stored child of its last
        block valid for the most leading positions of the next block; capped so that at least
        one token is computed (an exact repeat reuses all but its last token), and to whole
        blocks unless ``partial``. The caller releases the blocks when done with them."""
        with self._lock:
            blocks = self._chain(keys)
            tokens = sum(len(b.key.tokens) for b in blocks)
            more = partial and len(blocks) < len(keys)
            child = self._best_child(keys[len(blocks)]) if more else None
            if child is not None:
                blocks.append(child[0])
                tokens += child[1]
            tokens = min(tokens, prompt_len - 1)
            if not partial:
                tokens -= tokens % block_size
            blocks = [b for b in blocks if b.key.index * block_size < tokens]
            self._acquire(blocks)
            return Reuse(blocks, tokens if blocks else 0)

    def lookup(self, keys: Sequence[BlockKey]) -> list[Block]:
        """Acquire the longest chain of stored blocks matching ``keys`` from the first one."""
        with self._lock:
            return self._acquire(self._chain(keys))

    def acquire(self, key: BlockKey) -> Block | None:
        """Acquire the entry stored under exactly ``key`` (a snapshot), confirmed against its
        parent, tokens and extras; None when there is none."""
        with self._lock:
            entry = self._blocks.get(key.digest)
            if entry is None or not entry.matches(key):
                return None
            return self._acquire([entry])[0]

    def lookup_partial(self, wanted: BlockKey) -> tuple[Block, int] | None:
        """Acquire the stored child of ``wanted.parent`` at ``wanted.index`` whose leading rows
        are valid for the most leading positions of ``wanted``, with that count (> 0)."""
        with self._lock:
            best = self._best_child(wanted)
            if best is not None:
                self._acquire([best[0]])
            return best

    def _chain(self, keys: Sequence[BlockKey]) -> list[Block]:
        """The longest chain of stored blocks matching ``keys`` from the first one, a hit
        confirmed against parent, tokens and extras (counted: a lookup, its hits, collisions)."""
        self.stats.lookups += 1
        found: list[Block] = []
        for key in keys:
            block = self._blocks.get(key.digest)
            if block is None:
                break
            if not block.matches(key):
                self.stats.collisions += 1
                break
            found.append(block)
        self.stats.hit_blocks += len(found)
        return found

    def _best_child(self, wanted: BlockKey) -> tuple[Block, int] | None:
        """The sibling of ``wanted`` valid for the most of its leading positions, and how many
        (counted as a partial hit)."""
        best: tuple[Block, int] | None = None
        for block in self._siblings(wanted):
            n = agreeing_prefix(block.key, wanted)
            if n > 0 and (best is None or n > best[1]):
                best = (block, n)
        if best is not None:
            self.stats.partial_hits += 1
        return best

    @staticmethod
    def _acquire(blocks: list[Block]) -> list[Block]:
        for block in blocks:
            block.refcount += 1
        return blocks

    def covered(self, key: BlockKey) -> bool:
        """Whether a stored child of the same parent already holds valid rows for every
        position of ``key`` (so storing ``key`` would add nothing)."""
        with self._lock:
            return any(
                agreeing_prefix(block.key, key) == len(key.tokens) for block in self._siblings(key)
            )

    def _siblings(self, key: BlockKey) -> list[Block]:
        """The stored children of ``key.parent`` at ``key.index`` (index entries whose block is
        gone, e.g. evicted by a subclass behind the index's back, are skipped)."""
        found = (self._blocks.get(digest) for digest in self._children.get(key.parent, ()))
        place = (key.parent, key.index)
        return [b for b in found if b is not None and (b.key.parent, b.key.index) == place]

    def release(self, blocks: Iterable[Block]) -> None:
        """Drop one reference from each block."""
        with self._lock:
            for block in blocks:
                if block.refcount <= 0:
                    raise RuntimeError(f"block {block.key.index} released more often than acquired")
                block.refcount -= 1
                if block.refcount == 0 and block.superseded:
                    if self._blocks.get(block.key.digest) is block:
                        self._drop(block.key.digest)
                        self.stats.superseded += 1
            self._sync_stats()

    def touch(self, blocks: Sequence[Block]) -> None:
        """Mark blocks recently used, the first of them most recently: a chain's root outlives
        its leaves, so eviction trims chains from the end instead of orphaning them."""
        with self._lock:
            for block in reversed(blocks):
                if self._blocks.get(block.key.digest) is block:
                    self._blocks.move_to_end(block.key.digest)

    def insert(self, key: BlockKey, payload: Any, nbytes: int) -> Block | None:
        """Store a block (acquired once for the caller), or return the one already stored.

        Returns None when the block cannot fit: larger than ``max_bytes``, or everything
        that could be evicted is in use. The caller then stops storing its chain.
        """
        with self._lock:
            existing = self._blocks.get(key.digest)
            if existing is not None:
                if not existing.matches(key):
                    self.stats.collisions += 1
                    return None
                existing.refcount += 1
                return existing
            if nbytes <= self.max_bytes:
                self._supersede(key)
            if nbytes > self.max_bytes or not self._make_room(nbytes):
                self.stats.rejected += 1
                return None
            block = Block(key, payload, nbytes, refcount=1)
            self._blocks[key.digest] = block
            self._children.setdefault(key.parent, {})[key.digest] = None
            self._bytes += nbytes
            self.stats.stored_blocks += 1
            self._sync_stats()
            return block

    def _supersede(self, key: BlockKey) -> None:
        """Drop the shorter siblings that ``key`` fully covers (partial blocks whose every
        row is also valid in the block now stored), or mark them for dropping on release."""
        for old in self._siblings(key):
            if len(old.key.tokens) < len(key.tokens) and agreeing_prefix(old.key, key) == len(
                old.key.tokens
            ):
                old.superseded = True
                if old.refcount == 0:
                    self._drop(old.key.digest)
                    self.stats.superseded += 1

    def _drop(self, digest: bytes) -> None:
        block = self._blocks.pop(digest)
        self._bytes -= block.nbytes
        if self.on_drop is not None:
            self.on_drop(block.payload)
        siblings = self._children.get(block.key.parent)
        if siblings is not None:
            siblings.pop(digest, None)
            if not siblings:
                del self._children[block.key.parent]

    def _make_room(self, nbytes: int) -> bool:
        if self._bytes + nbytes <= self.max_bytes:
            return True
        victims: list[bytes] = []
        freed = 0
        for digest, block in self._blocks.items():
            if block.refcount == 0:
                victims.append(digest)
                freed += block.nbytes
                if self._bytes - freed + nbytes <= self.max_bytes:
                    break
        if self._bytes - freed + nbytes > self.max_bytes:
            return False
        for digest in victims:
            self._drop(digest)
            self.stats.evictions += 1
        return True

    def clear(self) -> None:
        """Drop every unreferenced block and reset the counters."""
        with self._lock:
            kept = OrderedDict((d, b) for d, b in self._blocks.items() if b.refcount > 0)
            if self.on_drop is not None:
                for block in self._blocks.values():
                    if block.refcount <= 0:
                        self.on_drop(block.payload)
            self._blocks = kept
            self._children = {}
            for digest, block in kept.items():
                self._children.setdefault(block.key.parent, {})[digest] = None
            self._bytes = sum(b.nbytes for b in kept.values())
            self.stats = PoolStats()
            self._sync_stats()

    def _sync_stats(self) -> None:
        self.stats.resident_bytes = self._bytes
        self.stats.resident_blocks = len(self._blocks)
