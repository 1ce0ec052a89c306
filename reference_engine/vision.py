"""The vision-embedding cache: preprocessing and vision-tower rows keyed by image digest.

An image's rows depend only on its pixels, so they are cached by digest and computed at most
once while cached, and only for images that still have uncached placeholders
(``VisionCache.suffix_rows``). ``slice_rows`` is the one place where a partly cached image is
cut: it returns exactly the rows of the placeholders that are still to be computed;
``merge_rows`` puts rows in place of their placeholders' token embeddings.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from pytest_prefixcache.types import Image

from .blocks import ImageSpan

__all__ = ["Prepared", "VisionCache", "merge_rows", "slice_rows"]


@dataclass
class Prepared:
    """One image, preprocessed: pixel patches, patch grid, placeholder count, and rows."""

    pixels: mx.array
    grid: tuple[int, int, int]
    count: int
    rows: mx.array | None = None


class VisionCache:
    """A bounded LRU of Prepared images by namespace and digest (an image another tenant sent
    is not a faster hit: the namespaces are kept apart as the KV blocks are)."""

    def __init__(self, model: Any, max_entries: int = 64) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0, got {max_entries}")
        self.model = model
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], Prepared] = OrderedDict()
        self._lock = threading.Lock()
        self.encoded = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def prepare(self, image: Image, *, use_cache: bool = True, namespace: str = "") -> Prepared:
        """The Prepared entry of ``image`` (from ``namespace``'s cache when allowed, else
        fresh)."""
        key = (namespace, image.digest)
        if use_cache:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                    return entry
        pixels, grid = self.model.preprocess(image.to_pil())
        entry = Prepared(pixels, grid, self.model.placeholder_count(grid))
        if use_cache and self.max_entries:
            with self._lock:
                self._entries[key] = entry
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        return entry

    def peek(self, digest: str, namespace: str = "") -> Prepared | None:
        """The cached entry of an image, without touching the LRU order or the counters."""
        with self._lock:
            return self._entries.get((namespace, digest))

    def rows(self, image: Image, entry: Prepared, *, use_cache: bool = True) -> mx.array:
        """All embedding rows of ``image`` (prepared as ``entry``); runs the vision tower only
        when they are not cached."""
        if entry.rows is not None and use_cache:
            self.hits += 1
            return entry.rows
        rows = self.model.vision_rows(entry.pixels, entry.grid)
        self.encoded += 1
        if rows.shape[0] != entry.count:
            raise RuntimeError(
                f"vision tower gave {rows.shape[0]} rows for {entry.count} placeholders of "
                f"{image!r}"
            )
        if use_cache:
            entry.rows = rows
        return rows

    def suffix_rows(
        self,
        spans: Sequence[ImageSpan],
        images: Sequence[Image],
        prepared: dict[str, Prepared],
        start: int,
        *,
        use_cache: bool = True,
    ) -> tuple[list[tuple[int, int, mx.array]], list[tuple[int, int]]]:
        """The rows to merge into positions [start, L): ``(first, end, rows)`` for the
        placeholders [first, end) of every image still to compute, in order, and
        ``(slots, rows)`` for each merge (raises if they differ)."""
        placed: list[tuple[int, int, mx.array]] = []
        merges: list[tuple[int, int]] = []
        for (span_start, span_end, _digest), image in zip(spans, images):
            if span_end <= start:
                continue
            all_rows = self.rows(image, prepared[image.digest], use_cache=use_cache)
            rows = slice_rows(all_rows, span_start, span_end, start)
            first = max(span_start, start)
            slots = span_end - first
            merges.append((slots, int(rows.shape[0])))
            if slots != rows.shape[0]:
                raise RuntimeError(
                    f"{slots} placeholder slots at [{first}, {span_end}) but {rows.shape[0]} rows"
                )
            placed.append((first, span_end, rows))
        return placed, merges

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
        self.encoded = 0
        self.hits = 0


def slice_rows(rows: mx.array, span_start: int, span_end: int, start: int) -> mx.array:
    """The rows of the placeholders of [span_start, span_end) at positions >= ``start``."""
    first = max(0, start - span_start)
    return rows[first : span_end - span_start]


def merge_rows(text: mx.array, start: int, placed: list[tuple[int, int, mx.array]]) -> mx.array:
    """Input embeddings of positions [start, L): ``text``, the token embeddings of those
    positions, with the rows of each ``(first, end, rows)`` of ``placed`` (in position order)
    in place of positions [first, end)."""
    pieces: list[mx.array] = []
    cursor = start
    for first, end, rows in placed:
        pieces.append(text[cursor - start : first - start])
        pieces.append(rows.astype(text.dtype))
        cursor = end
    pieces.append(text[cursor - start :])
    return mx.concatenate(pieces, axis=0)
