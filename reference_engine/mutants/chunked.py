"""A mutant of chunked prefill over recurrent checkpoints (bug class 28): the engine prefills
in chunks of ``prefill_step`` positions and snapshots only where a chunk ends.

Reproduces vLLM #51113, #54076 and #57278: a hybrid model's recurrent state stored under the
position of a checkpoint inside a chunk, holding the state at the chunk's end. A request that
resumes at that checkpoint restores the attention KV up to it and a recurrent state that has
already seen the positions after it, so those positions enter the state twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_prefixcache.types import Request

from ..blocks import BlockKey
from ..chunks import chunk_ends
from ..engine import Engine
from ..render import Rendered
from ..snapshots import take_snapshot

__all__ = ["SnapshotAtChunkEnd"]


class SnapshotAtChunkEnd(Engine):
    """Cuts its prefill only at chunk ends (and the prompt's end), then stores the state there
    under every boundary the chunk passed; the correct engine splits the chunk at each boundary
    (:func:`reference_engine.chunks.prefill_cuts`). Reproduces vLLM #51113, #54076 and #57278
    (a hybrid's state stored under the wrong chunk position)."""

    def prefill_cuts(self, bounds: Sequence[int], start: int, end: int) -> list[int]:
        # BUG: a boundary inside a chunk does not split it
        return [e - start for e in chunk_ends(start, end, self.prefill_step)]

    def snapshot(
        self,
        cache: list[Any],
        keys: Sequence[BlockKey],
        rendered: Rendered,
        request: Request,
        position: int,
    ) -> None:
        step = self.prefill_step or len(rendered.token_ids)
        chunk_start = (position - 1) // step * step
        for b in self.boundaries(rendered):
            if chunk_start < b <= position:
                snap = take_snapshot(cache, self.model.stateful_layers, position)
                snap.position = b  # BUG: the state after the chunk, filed under the boundary
                entry = self.pool.insert(self.snapshot_key(keys, rendered, request, b), snap, 1)
                if entry is not None:
                    self.pool.release([entry])
