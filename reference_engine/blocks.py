"""Chained block hashes over token ids and image extra keys.

A prompt is cut into fixed-size blocks; every full block gets a key, and so does the final
partial block (the prompt's tail, fewer tokens than a block). Block i's key is

    sha256(parent key, block token ids, extra keys)

where the parent of block 0 is a root derived from the namespace (model fingerprint, adapter,
tenant or cache salt), and the extra keys name, for each image whose placeholder run overlaps
the block, the image's digest and the offset of the block start relative to the image start.
So two different images that expand to identical placeholder tokens give different keys; the
same image in the same place gives the same key; and a block can only match after the exact
same chain of blocks. Keys are bytes, stable across processes and machines. The token count
is hashed too, so a partial block never shares a key with a full one.

``agreeing_prefix`` is the rule for reusing part of a stored block: the first j KV rows of a
block depend only on the positions before j, so they are valid for any prompt with the same
parent whose first j positions agree (same tokens; inside an image's placeholder run, the same
image at the same offset).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

__all__ = [
    "BlockKey",
    "ImageSpan",
    "KeyChain",
    "agreeing_prefix",
    "block_keys",
    "extra_keys",
    "namespace_root",
]

ImageSpan = tuple[int, int, str]
"""(start, end, digest): the placeholder run [start, end) of one image in the token ids."""

ExtraKey = tuple[str, int]
"""(image digest, block start - image start) for one image overlapping a block."""


@dataclass(frozen=True)
class BlockKey:
    """The key of one block (full, or the prompt's partial tail), with what it was computed
    from (for hit confirmation). It covers positions [index * block_size, ... + len(tokens))."""

    index: int
    digest: bytes
    parent: bytes
    tokens: tuple[int, ...]
    extras: tuple[ExtraKey, ...]


def namespace_root(*parts: str) -> bytes:
    """The parent key of block 0: a hash over the namespace parts, length-prefixed."""
    h = hashlib.sha256(b"pytest-prefixcache/namespace/v1")
    for part in parts:
        raw = part.encode("utf-8")
        h.update(struct.pack("<Q", len(raw)) + raw)
    return h.digest()


def extra_keys(start: int, end: int, spans: Sequence[ImageSpan]) -> tuple[ExtraKey, ...]:
    """Extra keys of the block [start, end): each overlapping image's digest and offset."""
    return tuple(
        (digest, start - img_start)
        for img_start, img_end, digest in spans
        if img_start < end and img_end > start
    )


def hash_block(parent: bytes, tokens: Sequence[int], extras: Sequence[ExtraKey]) -> bytes:
    """sha256(parent, tokens, extras) with every field length-prefixed."""
    h = hashlib.sha256(b"pytest-prefixcache/block/v1")
    h.update(parent)
    h.update(struct.pack(f"<Q{len(tokens)}q", len(tokens), *tokens))
    h.update(struct.pack("<Q", len(extras)))
    for digest, offset in extras:
        raw = digest.encode("ascii")
        h.update(struct.pack("<Q", len(raw)) + raw + struct.pack("<q", offset))
    return h.digest()


class KeyChain(Sequence[BlockKey]):
    """The keys of every block of ``token_ids`` (see ``block_keys``), hashed on demand in
    chain order: a lookup that misses at block 0 hashes one block, and the engine hashes the
    rest while the prefill runs (``complete``)."""

    def __init__(
        self, token_ids: Sequence[int], spans: Sequence[ImageSpan], *, block_size: int, root: bytes
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self._ids = tuple(map(int, token_ids))
        self._bs = block_size
        self._count = -(-len(self._ids) // block_size)
        # the extra keys of each block that an image overlaps, in the order of ``spans``
        # (what extra_keys gives, without testing every span against every block)
        self._extras: dict[int, list[ExtraKey]] = {}
        for img_start, img_end, digest in spans:
            first = max(0, img_start) // block_size
            for index in range(first, min(self._count, -(-img_end // block_size))):
                self._extras.setdefault(index, []).append((digest, index * block_size - img_start))
        self._keys: list[BlockKey] = []
        self._parent = root

    def __len__(self) -> int:
        return self._count

    def _upto(self, stop: int) -> None:
        """Hash blocks until ``stop`` keys exist."""
        keys, bs = self._keys, self._bs
        while len(keys) < stop:
            index = len(keys)
            tokens = self._ids[index * bs : (index + 1) * bs]
            extra = tuple(self._extras.get(index, ()))
            digest = hash_block(self._parent, tokens, extra)
            keys.append(BlockKey(index, digest, self._parent, tokens, extra))
            self._parent = digest

    @overload
    def __getitem__(self, i: int) -> BlockKey: ...
    @overload
    def __getitem__(self, i: slice) -> list[BlockKey]: ...
    def __getitem__(self, i: int | slice) -> BlockKey | list[BlockKey]:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._count)
            self._upto(max(start, stop) if step > 0 else start + 1)
            return self._keys[i]
        j = i + self._count if i < 0 else i
        if not 0 <= j < self._count:
            raise IndexError(f"block {i} of {self._count}")
        self._upto(j + 1)
        return self._keys[j]

    def __iter__(self) -> Iterator[BlockKey]:
        for index in range(self._count):
            self._upto(index + 1)
            yield self._keys[index]

    def complete(self) -> list[BlockKey]:
        """Hash every block; return all the keys."""
        self._upto(self._count)
        return list(self._keys)


def block_keys(
    token_ids: Sequence[int], spans: Sequence[ImageSpan], *, block_size: int, root: bytes
) -> list[BlockKey]:
    """Keys of every block of ``token_ids``, chained from ``root``: the full blocks, then the
    partial tail if the length is not a multiple of ``block_size``."""
    return KeyChain(token_ids, spans, block_size=block_size, root=root).complete()


def agreeing_prefix(stored: BlockKey, wanted: BlockKey) -> int:
    """How many leading rows of the block stored under ``stored`` are valid for ``wanted``
    (a key with the same parent and index): the tokens agree up to there, and the cut is
    clamped to the start of the first image that only one of them has there (a different
    image, or the same image at another offset, behind identical placeholder tokens)."""
    limit = min(len(stored.tokens), len(wanted.tokens))
    n = 0
    while n < limit and stored.tokens[n] == wanted.tokens[n]:
        n += 1
    for _digest, offset in set(stored.extras) ^ set(wanted.extras):
        n = min(n, max(0, -offset))  # -offset: where that image starts, relative to the block
    return n
