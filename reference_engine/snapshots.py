"""Snapshots of the layers that cannot be trimmed, at segment boundaries.

A full-attention layer's KV rows are valid for any prefix, so blocks give them back at token
granularity. A sliding-window layer (a ring of the last W positions) and a recurrent layer
(one state per sequence) cannot go back: a prefix is reusable only where a copy of their state
was taken at exactly its end. So while it prefills, the engine snapshots those layers at the
prompt's **boundaries** and, on a later request, resumes at the longest boundary not beyond
the matched prefix whose snapshot it still holds.

Boundaries (:func:`boundaries`) depend only on the prompt's content before them: the start of
every turn (the template's turn-start token: where conversations diverge, and the snapshot-aware
reference's message starts), the position after each **reply header** (the template's
generation prompt, e.g. ``<|im_start|>assistant\n``: a prompt that ends with it ends exactly
there, so the next turn of a growing chat resumes at the whole previous prompt; an exact repeat
resumes at that header's turn start), both edges of every image span, and every multiple of
:data:`GRID` positions (long messages): a superset of the snapshot-aware reference's boundaries
(message starts, image edges, earlier prompts' ends). Each cut costs a forward call of its own,
so the content start of a user or system turn is not a boundary: no earlier prompt ends there
(a prompt ending with a user turn ends with the generation prompt, one ending with an assistant
turn at the next turn's start), it only bought the three to six header tokens past a message
start where two user turns diverge, at one call per turn (``benchmarks/hybrid_cuts.py``). Without
a reply header (a template that gives none) every turn's content start is one, after the newline
that ends its header.

The engine cuts every prefill, cold or warm, at exactly these positions
(``LoadedModel.forward(cuts=...)``, whose last chunk then runs whole, to the prompt's end): a
warm run that resumes at boundary ``s`` computes the same chunks from the same state as the cold
run, so the two are bit-exact whatever the kernels do with a split (mlx-vlm's qwen3_5 is not
split-invariant: NOTES.md). Every prompt is also snapshotted at its end: its last chunk ran
whole, from its last boundary, exactly as the chunk a longer prompt computes there when the end
is one of its boundaries (a prompt that ends a turn: the next turn starts there; one that ends
with the generation prompt: the reply starts there); where it is not, no prompt ever looks it
up.

A snapshot is keyed by the prefix it ends: the chained hash of the blocks before it plus the
tokens and image extras of the partial block up to its position (the key a prompt cut there
would have), in a hash domain of its own. It lives in the block pool, counted in the byte
budget and evicted LRU like a block; a resumed request holds a reference to it. Its arrays are
copies, taken and restored by value: MLX's slice assignment writes into an array object in
place (``RotatingKVCache._update_in_place``), so a snapshot that shared array objects with a
live cache would change under it (bug class 17: a snapshot stored by reference and mutated).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from .blocks import BlockKey, ImageSpan, extra_keys, hash_block

__all__ = ["GRID", "Snapshot", "apply_snapshot", "boundaries", "snapshot_key", "take_snapshot"]

#: Every multiple of this many positions is a boundary too (the default prefill chunk).
GRID = 256
#: A turn header (turn token, role, newline) is at most this many tokens.
MAX_HEADER = 8


def boundaries(
    token_ids: Sequence[int],
    spans: Sequence[ImageSpan],
    turn_start_id: int | None,
    header_end_id: int | None = None,
    *,
    reply_header: Sequence[int] | None = None,
) -> list[int]:
    """The prompt's boundaries in (0, len]: turn starts, the position after each reply header
    (``reply_header``: the generation prompt's token ids, from its turn-start token), image-span
    edges, multiples of ``GRID``; sorted. ``len`` is one when the prompt ends with the
    generation prompt. Without ``reply_header``, the position after the newline
    (``header_end_id``) ending every turn header instead."""
    n = len(token_ids)
    found = set(range(GRID, n, GRID))
    if turn_start_id is not None:
        starts = [i for i, t in enumerate(token_ids) if t == turn_start_id]
        found.update(starts)
        if reply_header:
            h = tuple(reply_header)
            found.update(t + len(h) for t in starts if tuple(token_ids[t : t + len(h)]) == h)
        for t in starts if header_end_id is not None and not reply_header else ():
            for j in range(t + 1, min(n, t + MAX_HEADER + 1)):
                if token_ids[j] == header_end_id:
                    found.add(j + 1)
                    break
    for start, end, _digest in spans:
        found.update((start, end))
    return sorted(p for p in found if 0 < p <= n)


def snapshot_key(
    keys: Sequence[BlockKey],
    token_ids: Sequence[int],
    spans: Sequence[ImageSpan],
    position: int,
    *,
    block_size: int,
    root: bytes,
) -> BlockKey:
    """The pool key of the snapshot at ``position`` of a prompt cut into ``keys``."""
    index = position // block_size
    parent = root if index == 0 else keys[index - 1].digest
    first = index * block_size
    prefix = hash_block(parent, token_ids[first:position], extra_keys(first, position, spans))
    digest = hashlib.sha256(b"pytest-prefixcache/snapshot/v1" + prefix).digest()
    # its own parent: a snapshot is never a sibling of a block or of another snapshot
    return BlockKey(index, digest, digest, (position,), ())


@dataclass(eq=False)
class LayerState:
    """A copy of one layer's cache state: its arrays and its scalar bookkeeping."""

    arrays: tuple[mx.array | None, ...]
    meta: tuple[int, ...]


@dataclass(eq=False)
class Snapshot:
    """Copies of the non-trimmable layers' states after ``position`` prompt positions."""

    position: int
    layers: dict[int, LayerState]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for s in self.layers.values() for a in s.arrays if a is not None)


def _copy(a: Any) -> mx.array | None:
    return None if a is None else mx.array(a)


def _read(c: Any) -> LayerState:
    if hasattr(c, "max_size"):  # RotatingKVCache: the raw ring, its write index and offset
        return LayerState((_copy(c.keys), _copy(c.values)), (c.keep, c.max_size, c.offset, c._idx))
    return LayerState(tuple(_copy(a) for a in c.cache), ())  # ArraysCache


def _write(c: Any, state: LayerState) -> None:
    if hasattr(c, "max_size"):
        c.keys, c.values = (_copy(a) for a in state.arrays)
        c.keep, c.max_size, c.offset, c._idx = state.meta
    else:
        c.cache = [_copy(a) for a in state.arrays]


def take_snapshot(cache: Sequence[Any], layers: Sequence[int], position: int) -> Snapshot:
    """Copies of the states of ``layers`` of ``cache`` (evaluated before returning)."""
    snap = Snapshot(position, {i: _read(cache[i]) for i in layers})
    mx.eval([a for s in snap.layers.values() for a in s.arrays if a is not None])
    return snap


def apply_snapshot(snapshot: Snapshot, cache: Sequence[Any]) -> None:
    """Write copies of the snapshot's states into the matching layers of a fresh cache."""
    for i, state in snapshot.layers.items():
        _write(cache[i], state)
