"""Stored KV rows: one copy per request (a segment), one window of it per block, and the KV
store (``KVStore``) the engine calls to store a request's new blocks and to restore a chain.

Storing a request's new blocks copies its new KV rows ONCE per layer (a ``Segment``: for each
layer, keys and values of rows [start, end), copied out of the live cache) and gives each
block a ``Window`` on it (offset, rows). Copying per block instead costs MLX a slice and a copy
per block, layer, keys and values, and MLX pays per array far more than per byte
(``benchmarks/store.py``; the figures are in the README).

Restoring a chain concatenates its windows grouped into runs (consecutive windows of one
segment that follow each other), so a prefix stored by one request is one slice per layer,
keys and values, however many blocks it has.

Memory stays what the pool accounts for: a window's bytes are its rows, and a segment holds
exactly the rows of its windows. When the pool drops a block (evicted, superseded, cleared),
its window dies; ``Segments.compact`` then copies a segment's surviving windows into a new,
smaller segment, so a half-evicted segment never keeps the dropped rows alive.

MLX arrays are immutable: a restored cache is built from slices of segments, and its in-place
looking updates (``keys[..., a:b, :] = x``) write new buffers, never a segment's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx

from .blocks import BlockKey
from .pool import Block, BlockPool

__all__ = [
    "KVStore",
    "Restores",
    "Segment",
    "Segments",
    "Window",
    "copy_segment",
    "restore_windows",
]

Rows = list[tuple[mx.array, mx.array]]
"""Per layer, keys and values shaped (batch, kv heads, rows, head dim)."""


@dataclass(eq=False)
class Segment:
    """Copies of the KV rows of every layer for a run of consecutive positions."""

    layers: Rows
    rows: int

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)

    def window(self, offset: int, rows: int) -> Window:
        """A window on rows [offset, offset + rows) of this segment (alive until dropped)."""
        if offset < 0 or rows <= 0 or offset + rows > self.rows:
            raise ValueError(
                f"window [{offset}, {offset + rows}) is outside a segment of {self.rows} rows"
            )
        return Window(self, offset, rows)


@dataclass(eq=False)
class Window:
    """One stored block's payload: ``rows`` KV rows of ``segment`` from ``offset``."""

    segment: Segment
    offset: int
    rows: int
    alive: bool = True

    @property
    def nbytes(self) -> int:
        per_row = self.segment.nbytes // max(1, self.segment.rows)
        return per_row * self.rows

    def layers(self) -> Rows:
        """Views of this window's rows, per layer (keys, values)."""
        a, b = self.offset, self.offset + self.rows
        return [(k[:, :, a:b, :], v[:, :, a:b, :]) for k, v in self.segment.layers]


def copy_segment(cache: Sequence[Any], start: int, end: int, *, wait: bool = True) -> Segment:
    """A segment holding copies of the rows [start, end) of every layer of ``cache`` (KVCache
    layers, or anything with ``keys`` and ``values`` buffers), never views of live buffers
    (``wait=False``: the copies are launched, and done when ``layers`` is evaluated)."""
    if not 0 <= start < end:
        raise ValueError(f"cannot copy KV rows [{start}, {end})")
    layers = [
        (mx.array(c.keys[:, :, start:end, :]), mx.array(c.values[:, :, start:end, :]))
        for c in cache
    ]
    if wait:
        mx.eval(layers)
    else:
        mx.async_eval(layers)
    return Segment(layers, end - start)


def _runs(windows: Sequence[Window], tokens: int) -> list[tuple[Segment, int, int]]:
    """(segment, offset, rows) runs of the first ``tokens`` rows of ``windows`` in order."""
    lengths = [w.rows for w in windows]
    last = tokens - sum(lengths[:-1])
    if not 0 < last <= lengths[-1]:
        raise ValueError(f"{tokens} tokens from blocks of {lengths} rows")
    runs: list[tuple[Segment, int, int]] = []
    for i, w in enumerate(windows):
        rows = last if i == len(windows) - 1 else w.rows
        if runs and runs[-1][0] is w.segment and runs[-1][1] + runs[-1][2] == w.offset:
            seg, off, n = runs[-1]
            runs[-1] = (seg, off, n + rows)
        else:
            runs.append((w.segment, w.offset, rows))
    return runs


def restore_windows(
    make_cache: Callable[[int], list[Any]],
    windows: Sequence[Window],
    tokens: int,
    capacity: int,
    room: int,
) -> list[Any]:
    """A fresh cache (``make_cache(capacity)``) holding the first ``tokens`` rows of
    ``windows`` in order, then ``room`` empty rows, so appends write in place."""
    cache = make_cache(capacity)
    if not windows or tokens <= 0:
        return cache
    runs = _runs(windows, tokens)
    buffers = []
    for layer, c in enumerate(cache):
        parts = []
        for kind in (0, 1):
            pieces = [seg.layers[layer][kind][:, :, o : o + n, :] for seg, o, n in runs]
            tail = pieces[-1]
            if room:
                pieces.append(mx.zeros((*tail.shape[:2], room, tail.shape[3]), tail.dtype))
            parts.append(mx.concatenate(pieces, axis=2))
        c.state = tuple(parts)  # mlx-vlm's KVCache: its offset is now tokens + room,
        c.trim(room)  # and back to tokens: the room is where the next rows are written
        buffers += parts
    mx.eval(buffers)
    return cache


class Segments:
    """The windows of each segment the engine stored, and the segments whose windows the pool
    dropped, compacted on demand.

    Windows point at their segment, never the other way (the registry is here), so that a
    segment is freed by reference counting as soon as nothing points at it: a cycle would
    leave it to Python's cyclic collector, whose full passes walk every object of a process
    that has imported mlx-vlm, at random points of a request (README: what one costs).
    """

    def __init__(self) -> None:
        self._windows: dict[Segment, list[Window]] = {}  # by identity (Segment has no __eq__)
        self._dirty: dict[Segment, None] = {}  # in the order their first window died

    def track(self, windows: Sequence[Window]) -> None:
        """Register windows of one segment (for compaction once some of them are dropped)."""
        if windows:
            self._windows.setdefault(windows[0].segment, []).extend(windows)

    def dropped(self, payload: Any) -> None:
        """The pool dropped a block with this payload: its window is dead."""
        if isinstance(payload, Window) and payload.alive:
            payload.alive = False
            self._dirty[payload.segment] = None

    def discard(self, windows: Sequence[Window]) -> None:
        """Windows that never made it into the pool (not stored, or already stored)."""
        for w in windows:
            self.dropped(w)

    def members(self, segment: Segment) -> list[Window]:
        """The registered windows of ``segment``, dead ones included until compaction."""
        return list(self._windows.get(segment, ()))

    def compact(self) -> int:
        """Copy each dirty segment's live windows into a new segment; return rows freed."""
        freed = 0
        dirty, self._dirty = list(self._dirty), {}
        for seg in dirty:
            windows = self._windows.pop(seg, None)
            if windows is None:  # not registered: freed with its only window
                continue
            live = sorted((w for w in windows if w.alive), key=lambda w: w.offset)
            kept = sum(w.rows for w in live)
            freed += seg.rows - kept
            if not live:
                continue
            runs = _runs(live, kept)
            layers = [
                (
                    mx.concatenate([k[:, :, o : o + n, :] for _, o, n in runs], axis=2),
                    mx.concatenate([v[:, :, o : o + n, :] for _, o, n in runs], axis=2),
                )
                for k, v in seg.layers
            ]
            mx.eval(layers)
            new = Segment(layers, kept)
            offset = 0
            for w in live:
                w.segment, w.offset = new, offset
                offset += w.rows
            self._windows[new] = live
        return freed


class Restores(Protocol):
    """What :class:`KVStore` needs of the model (``model.LoadedModel`` has it): a fresh cache
    from a chain of windows. A protocol, so that this module imports nothing of the model's."""

    def restore(self, blocks: Sequence[Window], tokens: int, capacity: int = 0) -> list[Any]: ...


class KVStore:
    """The KV rows of the pool's blocks, as the engine stores and restores them.

    ``store`` copies a request's new rows once (a segment) and inserts a window on it per block
    into the pool; the windows the pool does not take die at once. ``restore`` builds a fresh
    cache from a chain of windows. The pool reports the blocks it drops to ``dropped`` (its
    ``on_drop``), and ``compact``, run after every request, shrinks the segments that lost
    windows (``segments``).

    Args:
        model: the model whose KV caches are restored (``LoadedModel.restore``).
    """

    def __init__(self, model: Restores) -> None:
        self.model = model
        self.segments = Segments()

    def store(
        self, pool: BlockPool, cache: list[Any], keys: Sequence[BlockKey], *, block_size: int
    ) -> None:
        """Insert a block per key of ``keys`` (consecutive) into ``pool``, each a window on
        one copy of their rows of ``cache``. The copy is launched, then evaluated before
        returning: called while MLX computes the prefill's last chunk, it overlaps with it."""
        if not keys:
            return
        base = keys[0].index * block_size
        end = keys[-1].index * block_size + len(keys[-1].tokens)
        segment = copy_segment(cache, base, end, wait=False)
        windows = [segment.window(k.index * block_size - base, len(k.tokens)) for k in keys]
        self.segments.track(windows)
        stored: list[Block] = []
        try:
            for key, window in zip(keys, windows):
                block = pool.insert(key, window, window.nbytes)
                if block is None:  # it does not fit (or collides): the chain stops here
                    break
                stored.append(block)
            mx.eval([segment.layers])  # the copies done before anything can read them
        finally:
            stored_before = [w for w, b in zip(windows, stored) if b.payload is not w]
            self.segments.discard(stored_before + windows[len(stored) :])
            pool.touch(stored)
            pool.release(stored)

    def restore(self, windows: Sequence[Window], tokens: int, capacity: int) -> list[Any]:
        """A fresh KV cache holding the first ``tokens`` rows of ``windows`` in chain order,
        with room for ``capacity`` positions (prompt and decode) written in place."""
        return self.model.restore(windows, tokens, capacity)

    def dropped(self, payload: Any) -> None:
        """The pool let go of a block with this payload (evicted, superseded or cleared)."""
        self.segments.dropped(payload)

    def compact(self) -> int:
        """Copy the live windows of every segment that lost some; return the rows freed."""
        return self.segments.compact()
