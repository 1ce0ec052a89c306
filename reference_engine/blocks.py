"""Chained block hashes over token ids and image extra keys.

A prompt is cut into fixed-size blocks; only full blocks get a key. Block i's key is

    sha256(parent key, block token ids, extra keys)

where the parent of block 0 is a root derived from the namespace (model fingerprint, adapter,
tenant or cache salt), and the extra keys name, for each image whose placeholder run overlaps
the block, the image's digest and the offset of the block start relative to the image start.
So two different images that expand to identical placeholder tokens give different keys; the
same image in the same place gives the same key; and a block can only match after the exact
same chain of blocks. Keys are bytes, stable across processes and machines.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BlockKey", "ImageSpan", "block_keys", "extra_keys", "namespace_root"]

ImageSpan = tuple[int, int, str]
"""(start, end, digest): the placeholder run [start, end) of one image in the token ids."""

ExtraKey = tuple[str, int]
"""(image digest, block start - image start) for one image overlapping a block."""


@dataclass(frozen=True)
class BlockKey:
    """The key of one full block, with what it was computed from (for hit confirmation)."""

    index: int
    digest: bytes
    parent: bytes
    tokens: tuple[int, ...]
    extras: tuple[ExtraKey, ...]

    @property
    def start(self) -> int:
        return self.index * len(self.tokens)


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


def block_keys(
    token_ids: Sequence[int], spans: Sequence[ImageSpan], *, block_size: int, root: bytes
) -> list[BlockKey]:
    """Keys of every full block of ``token_ids``, chained from ``root``."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    keys: list[BlockKey] = []
    parent = root
    for index in range(len(token_ids) // block_size):
        start, end = index * block_size, (index + 1) * block_size
        tokens = tuple(int(t) for t in token_ids[start:end])
        extras = extra_keys(start, end, spans)
        digest = hash_block(parent, tokens, extras)
        keys.append(BlockKey(index, digest, parent, tokens, extras))
        parent = digest
    return keys
