"""The reference engine: a segmented multimodal prefix cache that is bit-exact against cold runs.

``Engine.run`` follows one path for cached and uncached runs; the only difference is how many
leading positions' KV rows come from the pool:

    render (render.py, tokens.py: token ids, image spans, message starts)
    -> block keys (blocks.py, hashed as the lookup needs them)
    -> lookup (pool.py, ``BlockPool.reuse``: token granularity, at least one token computed)
    -> restore the reused rows into a buffer sized for the whole prompt (kv.py, ``KVStore``)
    -> embeddings of the suffix (vision.py: rows only for uncached placeholders, sliced
    exactly) -> prefill the suffix with the full prompt's position ids (model.py; the other
    keys hashed meanwhile) -> store the new blocks and the prompt's partial tail (kv.py: one
    copy of their rows, a window per block) -> release -> greedy decode (model.py)

Each step is a method, so a mutant (``reference_engine.mutants``) can break exactly one.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from pytest_prefixcache.types import Outcome, Request

from .blocks import BlockKey, KeyChain, namespace_root
from .kv import KVStore, Segments
from .model import LoadedModel, default_model_path, load_model
from .pool import BlockPool, Reuse
from .render import Rendered, render
from .tokens import PieceTokenizer
from .vision import Prepared, VisionCache, merge_rows

__all__ = ["DEFAULT_MAX_BYTES", "Engine", "EngineStats", "default_model_path"]

#: Default byte budget of the block pool: 1 GiB of KV rows.
DEFAULT_MAX_BYTES = 1 << 30


@dataclass(frozen=True)
class EngineStats:
    """Cache counters since the last reset."""

    requests: int
    lookups: int
    hit_tokens: int
    prompt_tokens: int
    stored_blocks: int
    evictions: int
    resident_bytes: int
    resident_blocks: int
    vision_encoded: int
    vision_hits: int


class Engine:
    """A reference MLX engine with a chained-hash, image-aware block prefix cache.

    Args:
        model: a loaded model (see ``Engine.from_pretrained``).
        block_size: tokens per block. Default: ``16``.
        max_bytes: byte budget of stored KV blocks. Default: ``DEFAULT_MAX_BYTES``.
        vision_entries: images whose embeddings are kept. Default: ``64``.
    """

    #: Reuse part of a block (token granularity). False: whole blocks only, as block-granular
    #: caches do (the bug-zoo mutants of a match ending inside an image need that).
    partial_blocks = True

    @property
    def reuse_reference(self) -> str:
        """The design the plugin judges this cache by: ``"token"``, or ``"block"`` (blocks of
        ``block_size``) for whole blocks only; a block size alone is not a declaration."""
        return "token" if self.partial_blocks else "block"

    def __init__(
        self,
        model: LoadedModel,
        *,
        block_size: int = 16,
        max_bytes: int = DEFAULT_MAX_BYTES,
        vision_entries: int = 64,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.model = model
        self.block_size = block_size
        self.kv = KVStore(model)
        self.pool = BlockPool(max_bytes, on_drop=self.kv.dropped)
        self.vision = VisionCache(model, vision_entries)
        self.tokens = PieceTokenizer.for_tokenizer(model.tokenizer)
        self._lock = threading.RLock()
        self._requests = 0
        self._hit_tokens = 0
        self._prompt_tokens = 0

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        block_size: int = 16,
        max_bytes: int = DEFAULT_MAX_BYTES,
        vision_entries: int = 64,
    ) -> Engine:
        """Load an mlx-vlm model directory (offline) and wrap it in an engine."""
        return cls(
            load_model(path),
            block_size=block_size,
            max_bytes=max_bytes,
            vision_entries=vision_entries,
        )

    @property
    def stats(self) -> EngineStats:
        ps = self.pool.stats
        return EngineStats(
            requests=self._requests,
            lookups=ps.lookups,
            hit_tokens=self._hit_tokens,
            prompt_tokens=self._prompt_tokens,
            stored_blocks=ps.stored_blocks,
            evictions=ps.evictions,
            resident_bytes=self.pool.resident_bytes,
            resident_blocks=len(self.pool),
            vision_encoded=self.vision.encoded,
            vision_hits=self.vision.hits,
        )

    @property
    def segments(self) -> Segments:
        """The KV store's segments and their windows (for inspection)."""
        return self.kv.segments

    def cache_usage(self) -> dict[str, int]:
        """Memory of the block pool, for the plugin's memory-budget check."""
        return {
            "resident_bytes": self.pool.resident_bytes,
            "entries": len(self.pool),
            "max_bytes": self.pool.max_bytes,
        }

    def reset(self) -> None:
        """Drop every cached block and image, and zero the counters."""
        with self._lock:
            self.pool.clear()
            self.kv.compact()
            self.vision.clear()
            if self.tokens is not None:
                self.tokens.clear()
            self._requests = self._hit_tokens = self._prompt_tokens = 0

    # -- the request path -------------------------------------------------------------------
    def run(self, request: Request, *, use_cache: bool = True, template: bool = True) -> Outcome:
        """Serve ``request``; with ``use_cache=False`` the caches are neither read nor written;
        ``template=False`` takes its text as the prompt, without the chat template."""
        with self._lock:
            prepared = {
                img.digest: self.vision.prepare(
                    img, use_cache=use_cache, namespace=request.namespace
                )
                for img in request.images
            }
            rendered = self.render(request, prepared, use_cache=use_cache, template=template)
            keys = self.keys(rendered, request) if use_cache else []
            reuse = self.lookup(keys, len(rendered.token_ids)) if use_cache else Reuse()
            try:
                return self._serve(request, rendered, prepared, keys, reuse, use_cache)
            finally:
                self.pool.release(reuse.blocks)
                self.kv.compact()

    def render(
        self,
        request: Request,
        prepared: dict[str, Prepared],
        *,
        use_cache: bool = True,
        template: bool = True,
    ) -> Rendered:
        """Token ids and image spans; cached runs tokenise piece by piece (``tokens.py``)."""
        return render(
            request,
            processor=self.model.processor,
            image_token_id=self.model.image_token_id,
            placeholder_count=lambda img: prepared[img.digest].count,
            encode=(
                functools.partial(self.tokens.encode, namespace=request.namespace)
                if use_cache and self.tokens is not None
                else None
            ),
            template=template,
        )

    def keys(self, rendered: Rendered, request: Request) -> Sequence[BlockKey]:
        """The prompt's block keys, hashed as the lookup needs them (the rest during the
        prefill, see ``prefill``)."""
        root = namespace_root(self.model.fingerprint, request.namespace)
        return KeyChain(rendered.token_ids, rendered.spans, block_size=self.block_size, root=root)

    def lookup(self, keys: Sequence[BlockKey], prompt_len: int) -> Reuse:
        """What the pool lets this prompt reuse (``BlockPool.reuse``), its blocks acquired."""
        return self.pool.reuse(
            keys, prompt_len, block_size=self.block_size, partial=self.partial_blocks
        )

    def _serve(
        self,
        request: Request,
        rendered: Rendered,
        prepared: dict[str, Prepared],
        keys: Sequence[BlockKey],
        reuse: Reuse,
        use_cache: bool,
    ) -> Outcome:
        ids = rendered.token_ids
        start = reuse.tokens
        cache = self.restore(reuse, len(ids) + request.max_new_tokens)
        embeds, merges = self.suffix_embeddings(rendered, prepared, start, use_cache=use_cache)
        grids = [prepared[img.digest].grid for img in rendered.images]
        positions, delta = self.model.positions(ids, grids)
        stored = False

        def store() -> None:  # while MLX computes the last chunk: it reads that chunk's rows
            nonlocal stored
            stored = True
            self.store(cache, keys, start // self.block_size)

        hooks = {
            "meanwhile": getattr(keys, "complete", None),  # a KeyChain: hash the rest
            "at_last_chunk": store if use_cache else None,
        }
        hooks = hooks if _takes_hooks(self.prefill) else {}
        logits = self.prefill(ids, start, embeds, cache, positions, **hooks)
        if use_cache:
            if not stored:  # a prefill without the hooks, or one that never ran the model
                store()
            self.pool.touch(reuse.blocks)
            self._requests += 1
            self._hit_tokens += start
            self._prompt_tokens += len(ids)
        tokens, steps = self.decode(logits, cache, len(ids), delta, request.max_new_tokens)
        return Outcome(
            logits=steps[0],
            tokens=tokens,
            step_logits=tuple(steps[: len(tokens)]),
            cached_tokens=start,
            prompt_tokens=len(ids),
            token_ids=ids,
            image_spans=rendered.spans,
            merges=tuple(merges),
            message_starts=rendered.message_starts,
        )

    def restore(self, reuse: Reuse, capacity: int) -> list[Any]:
        """A fresh KV cache holding copies of the reused rows, in chain order, with room for
        ``capacity`` positions (prompt and decode)."""
        return self.kv.restore([b.payload for b in reuse.blocks], reuse.tokens, capacity)

    def prefill(
        self,
        ids: Sequence[int],
        start: int,
        embeds: mx.array,
        cache: list[Any],
        positions: mx.array,
        *,
        meanwhile: Callable[[], object] | None = None,
        at_last_chunk: Callable[[], object] | None = None,
    ) -> mx.array:
        """Compute positions [start, L) on top of ``cache`` with the whole prompt's position
        ids (M-RoPE continues across the cached prefix); return the last position's logits.
        ``meanwhile`` runs while MLX computes the first chunk (the engine hashes the keys the
        lookup did not need), ``at_last_chunk`` while it computes the last one (the engine
        stores the new blocks). An override may leave both out of its signature: the engine
        then stores after it returns."""
        return self.model.forward(
            ids[start:],
            embeds,
            cache,
            positions[:, :, start:],
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
        self.kv.store(self.pool, cache, todo, block_size=self.block_size)

    def decode(
        self, logits: mx.array, cache: list[Any], prompt_len: int, delta: int, max_new: int
    ) -> tuple[tuple[int, ...], list[np.ndarray]]:
        """Greedy continuation; returns the tokens and the logits before each of them."""
        return self.model.greedy(logits, cache, prompt_len, delta, max_new)


def _takes_hooks(prefill: Callable[..., mx.array]) -> bool:
    """Whether ``prefill`` takes ``meanwhile`` and ``at_last_chunk`` (an override written
    without them is called without them)."""
    params = inspect.signature(prefill).parameters.values()
    names = {p.name for p in params}
    return {"meanwhile", "at_last_chunk"} <= names or any(p.kind is p.VAR_KEYWORD for p in params)
