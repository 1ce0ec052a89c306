"""The engine's compute steps on one request's own cache: restore the reused rows (and the
snapshot's states), embed the suffix, prefill it, store the new blocks, decode greedily, and
let the requests in flight take turns between steps. A part of
:class:`~reference_engine.engine.Engine`, one step a method (a mutant breaks exactly one)."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from .blocks import BlockKey
from .kv import KVStore
from .model import LoadedModel
from .pool import BlockPool, Reuse
from .render import Rendered
from .snapshots import apply_snapshot
from .vision import Prepared, VisionCache, merge_rows

__all__ = ["Compute", "accepted_hooks"]


class Compute:
    """The engine's compute steps (see the module)."""

    model: LoadedModel
    pool: BlockPool
    kv: KVStore
    vision: VisionCache
    block_size: int
    _compute: threading.RLock

    if TYPE_CHECKING:  # QuantizedKV's (kvquant.py)

        def quantize_cache(self, cache: list[Any], reused: int) -> list[Any]: ...

    def restore(self, reuse: Reuse, capacity: int) -> list[Any]:
        """A fresh KV cache holding copies of the reused rows, in chain order, with room for
        ``capacity`` positions (prompt and decode), and copies of the snapshot's states."""
        cache = self.kv.restore([b.payload for b in reuse.blocks], reuse.tokens, capacity)
        if reuse.snapshot is not None:
            apply_snapshot(reuse.snapshot.payload, cache)
        return self.quantize_cache(cache, reuse.tokens)

    def prefill(
        self,
        ids: Sequence[int],
        start: int,
        embeds: mx.array,
        cache: list[Any],
        positions: mx.array | None,
        *,
        cuts: Sequence[int] | None = None,
        at_cut: Callable[[int], object] | None = None,
        meanwhile: Callable[[], object] | None = None,
        at_last_chunk: Callable[[], object] | None = None,
    ) -> mx.array:
        """Compute positions [start, L) on top of ``cache`` with the whole prompt's position
        ids (M-RoPE continues across the cached prefix); return the last position's logits.
        ``cuts`` (relative to ``start``) are where chunks end on a model with non-trimmable
        layers, ``at_cut`` runs after each (the engine snapshots there). ``meanwhile`` runs
        while MLX computes the first chunk (the engine hashes the keys the lookup did not
        need), ``at_last_chunk`` while it computes the last one (the engine stores the new
        blocks). An override may leave any of them out of its signature: the engine then
        stores after it returns."""
        return self.model.forward(
            ids[start:],
            embeds,
            cache,
            None if positions is None else positions[:, :, start:],
            cuts=cuts,
            at_cut=at_cut,
            meanwhile=meanwhile,
            at_last_chunk=at_last_chunk,
        )

    def suffix_embeddings(
        self, rendered: Rendered, prepared: dict[str, Prepared], start: int, *, use_cache: bool
    ) -> tuple[mx.array, list[tuple[int, int]]]:
        """Input embeddings of positions [start, L): token embeddings with the rows of every
        image placeholder still to compute merged in; returns them and (slots, rows) per merge."""
        placed, merges = self.vision.suffix_rows(
            rendered.spans, rendered.images, prepared, start, use_cache=use_cache
        )
        return merge_rows(self.model.embed(rendered.token_ids[start:]), start, placed), merges

    def store(self, cache: list[Any], keys: Sequence[BlockKey], first: int) -> None:
        """Store the blocks from index ``first`` on in the KV store (``KVStore.store``): the
        partial tail too, unless a stored sibling already covers it."""
        todo = list(keys[first:])
        if todo and len(todo[-1].tokens) < self.block_size and self.pool.covered(todo[-1]):
            todo.pop()
        full = [cache[i] for i in self.model.full_layers]  # the others live in snapshots
        self.kv.store(self.pool, full, todo, block_size=self.block_size)

    def decode(
        self, logits: mx.array, cache: list[Any], prompt_len: int, delta: int, max_new: int
    ) -> tuple[tuple[int, ...], list[np.ndarray]]:
        """Greedy continuation; returns the tokens and the logits before each of them.
        Between two steps the requests in flight take turns (``interleave``)."""
        return self.model.greedy(logits, cache, prompt_len, delta, max_new, self.interleave)

    def interleave(self) -> None:
        """Let another request in flight run a phase (its render, prefill or decode step):
        continuous batching, one request's forward at a time on its own cache. Only when the
        caller holds the compute lock once (an override holding it twice keeps it)."""
        compute = self._compute
        try:
            compute.release()
        except RuntimeError:  # not held by this thread
            return
        try:
            time.sleep(0)  # let a waiting thread take the lock
        finally:
            compute.acquire()


def accepted_hooks(prefill: Callable[..., mx.array], hooks: dict[str, Any]) -> dict[str, Any]:
    """The hooks ``prefill`` takes: an override written without ``meanwhile`` and
    ``at_last_chunk`` is called without them (and stores after it returns); ``cuts`` and
    ``at_cut`` are passed where it takes them."""
    params = inspect.signature(prefill).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return hooks
    names = {p.name for p in params}
    if not {"meanwhile", "at_last_chunk"} <= names:
        names -= {"meanwhile", "at_last_chunk"}
    return {k: v for k, v in hooks.items() if k in names}
