"""Where a request resumes on a model with sliding-window or recurrent layers: the prompt's
boundaries, the snapshots stored at them and their pool keys, and the resume point (the
longest boundary not beyond the reused prefix whose snapshot is stored). A part of
:class:`~reference_engine.engine.Engine`, one step a method (a mutant breaks exactly one)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_prefixcache.types import Request

from .blocks import BlockKey
from .chunks import prefill_cuts
from .model import LoadedModel
from .pool import BlockPool, Reuse
from .render import Rendered
from .snapshots import boundaries, snapshot_key, take_snapshot

__all__ = ["Resume", "checked_step"]


def checked_step(prefill_step: int | None) -> int | None:
    """``prefill_step`` if it is None or a positive int; ValueError naming it otherwise."""
    if prefill_step is not None and (not isinstance(prefill_step, int) or prefill_step <= 0):
        raise ValueError(f"prefill_step must be a positive int or None, got {prefill_step!r}")
    return prefill_step


class Resume:
    """The engine's snapshot steps (see the module)."""

    model: LoadedModel
    pool: BlockPool
    block_size: int
    prefill_step: int | None
    _snapshots_stored: int
    _snapshot_hits: int

    if TYPE_CHECKING:

        def root(self, namespace: str, adapter: str | None = None) -> bytes: ...

    def prefill_cuts(self, bounds: Sequence[int], start: int, end: int) -> list[int]:
        """Where the prefill of [start, end) cuts: at every boundary (``bounds``) past ``start``
        and, with a ``prefill_step``, at every chunk end (:func:`.chunks.prefill_cuts`)."""
        return prefill_cuts(bounds, start, end, self.prefill_step)

    def boundaries(self, rendered: Rendered) -> list[int]:
        """Where this prompt's prefill is cut and its non-trimmable layers snapshotted."""
        if rendered.boundaries is not None:  # found by ``Engine.render``: once per request
            return list(rendered.boundaries)
        m = self.model
        return boundaries(
            rendered.token_ids,
            rendered.spans,
            m.turn_start_id,
            m.header_end_id,
            reply_header=m.reply_header,
        )

    def snapshot_key(
        self, keys: Sequence[BlockKey], rendered: Rendered, request: Request, position: int
    ) -> BlockKey:
        """The pool key of this prompt's snapshot at ``position``."""
        return snapshot_key(
            keys,
            rendered.token_ids,
            rendered.spans,
            position,
            block_size=self.block_size,
            root=self.root(request.namespace, request.adapter),
        )

    def resume_point(
        self, reuse: Reuse, rendered: Rendered, keys: Sequence[BlockKey], request: Request
    ) -> Reuse:
        """Where a model with non-trimmable layers resumes: the longest boundary not beyond
        the reused prefix whose snapshot is stored; the blocks past it released."""
        snapshot = None
        for position in reversed(self.boundaries(rendered)):
            if position > reuse.tokens:
                continue
            snapshot = self.pool.acquire(self.snapshot_key(keys, rendered, request, position))
            if snapshot is not None:
                break
        start = 0 if snapshot is None else snapshot.payload.position
        kept = [b for b in reuse.blocks if b.key.index * self.block_size < start]
        self.pool.release(reuse.blocks[len(kept) :])
        if snapshot is not None:
            self._snapshot_hits += 1
        return Reuse(kept, start, snapshot)

    def snapshot(
        self,
        cache: list[Any],
        keys: Sequence[BlockKey],
        rendered: Rendered,
        request: Request,
        position: int,
    ) -> None:
        """Store a snapshot of the non-trimmable layers after ``position`` prompt positions
        (called by the prefill at each boundary it passes), counted in the pool's budget."""
        snap = take_snapshot(cache, self.model.stateful_layers, position)
        key = self.snapshot_key(keys, rendered, request, position)
        entry = self.pool.insert(key, snap, snap.nbytes)
        if entry is not None:
            if entry.payload is snap:
                self._snapshots_stored += 1
            self.pool.touch([entry])
            self.pool.release([entry])
