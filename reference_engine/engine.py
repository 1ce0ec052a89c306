"""The reference engine: a segmented multimodal prefix cache that is bit-exact against cold runs.

``Engine.run`` follows one path for cached and uncached runs; the only difference is how many
leading positions' KV rows come from the pool:

    render (render.py, tokens.py: token ids, image spans, message starts)
    -> block keys (blocks.py, hashed as the lookup needs them)
    -> lookup (pool.py, ``BlockPool.reuse``: token granularity, at least one token computed)
    -> choose the resume point per layer kind (snapshots.py: on a model with sliding-window
    or recurrent layers, the longest boundary not beyond the match whose snapshot is stored)
    -> restore the reused rows into a buffer sized for the whole prompt (kv.py, ``KVStore``),
    and the snapshot's states -> embeddings of the suffix (vision.py: rows only for uncached
    placeholders, sliced exactly) -> prefill the suffix with the full prompt's position ids
    (model.py; the other keys hashed meanwhile; cut at the prompt's boundaries on a model with
    non-trimmable layers, snapshotting each one passed) -> store the new blocks and the
    prompt's partial tail (kv.py: one copy of the full-attention layers' rows, a window per
    block) -> release -> greedy decode (model.py) -> with ``cache_output``, store the KV the
    decode computed under the prompt + output tokens (``store_output``)

Two cache designs (``cache_output``, or ``PREFIXCACHE_REFERENCE_CACHE``): ``prompt`` (the
default) stores the prompt's KV only; ``prompt+output`` also stores the rows the decode
computed (every output token but the last, which is never fed back), so that the next turn,
whose prompt carries the reply, reuses them up to the first token where the chat template's
re-tokenised reply differs from the generated ids (the pool's token-granular match stops
there by itself). The engine declares no decode rule (``decode_atol``): it reuses
decode-time KV only on full-attention models, where a decode step and a prefill agree bit
for bit on the fixtures (``benchmarks/decode_tolerance.py``: qwen2_vl 0.0); on a model with
sliding-window or recurrent layers it resumes at snapshots, never inside a reply.

Each step is a method, so a mutant (``reference_engine.mutants``) can break exactly one.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from pytest_prefixcache.errors import EngineError
from pytest_prefixcache.types import Outcome, Request

from .blocks import BlockKey, KeyChain, namespace_root
from .inflight import IN_FLIGHT_WAIT, InFlight
from .kv import KVStore, Segments
from .model import LoadedModel, default_model_path, load_model
from .pool import BlockPool, Reuse
from .render import Rendered, render
from .snapshots import apply_snapshot, boundaries, snapshot_key, take_snapshot
from .tokens import PieceTokenizer
from .vision import Prepared, VisionCache, merge_rows

__all__ = ["DEFAULT_MAX_BYTES", "Engine", "EngineStats", "default_model_path"]

#: Default byte budget of the block pool: 1 GiB of KV rows.
DEFAULT_MAX_BYTES = 1 << 30

#: The cache designs, by the name ``PREFIXCACHE_REFERENCE_CACHE`` takes.
CACHE_DESIGNS = {"prompt": False, "prompt+output": True}
CACHE_ENV = "PREFIXCACHE_REFERENCE_CACHE"


def cache_output_from_env() -> bool:
    """Whether ``PREFIXCACHE_REFERENCE_CACHE`` asks for the prompt+output design (unset or
    empty: ``prompt``); any other value is an EngineError naming it."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if not value:
        return False
    if value not in CACHE_DESIGNS:
        raise EngineError(
            f"{CACHE_ENV}={value!r} is not one of {', '.join(map(repr, CACHE_DESIGNS))}"
        )
    return CACHE_DESIGNS[value]


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
    snapshots_stored: int = 0
    snapshot_hits: int = 0


class Engine:
    """A reference MLX engine with a chained-hash, image-aware block prefix cache.

    Args:
        model: a loaded model (see ``Engine.from_pretrained``).
        block_size: tokens per block. Default: ``16``.
        max_bytes: byte budget of stored KV blocks. Default: ``DEFAULT_MAX_BYTES``.
        vision_entries: images whose embeddings are kept. Default: ``64``.
        cache_output: also store the KV computed while decoding, under the prompt + output
            tokens (the ``prompt+output`` design). Default: ``PREFIXCACHE_REFERENCE_CACHE``,
            else ``False`` (``prompt``: the prompt's KV only).
    """

    #: Requests ``run`` may serve at once (the plugin's waves property sends up to this many).
    max_concurrency = 4
    #: A reply never depends on the requests in flight with it (each request's forward runs
    #: on its own cache): a cold wave that differs from the same requests alone is a
    #: batching fault, not noise.
    batch_invariant = True
    #: Seconds a request waits for the request in flight writing its next block.
    in_flight_wait = IN_FLIGHT_WAIT

    #: Reuse part of a block (token granularity). False: whole blocks only, as block-granular
    #: caches do (the bug-zoo mutants of a match ending inside an image need that).
    partial_blocks = True

    @property
    def reuse_reference(self) -> str:
        """The design the plugin judges this cache by: ``"snapshot"`` on a model with
        non-trimmable layers (it resumes only where it snapshotted), else ``"token"``, or
        ``"block"`` for whole blocks only (``partial_blocks = False``, blocks of
        ``block_size``); a block size alone is not a declaration."""
        if self.model.stateful_layers:
            return "snapshot"
        return "token" if self.partial_blocks else "block"

    def __init__(
        self,
        model: LoadedModel,
        *,
        block_size: int = 16,
        max_bytes: int = DEFAULT_MAX_BYTES,
        vision_entries: int = 64,
        cache_output: bool | None = None,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.model = model
        self.caches_output = cache_output_from_env() if cache_output is None else cache_output
        """The prompt+output design: the plugin's references count output tokens as reusable."""
        self.last_token_kv = False
        """Its decode never feeds the last generated token back (:meth:`decode`): a reuse
        bound of the prompt + all output tokens but the last."""
        self.block_size = block_size
        self.kv = KVStore(model)
        self.pool = BlockPool(max_bytes, on_drop=self.kv.dropped)
        self.vision = VisionCache(model, vision_entries)
        self.tokens = PieceTokenizer.for_tokenizer(model.tokenizer)
        self._lock = threading.RLock()
        self._compute = self._lock  # one phase of one request at a time (MLX)
        self._admission = threading.Lock()  # lookups and announcements, in served order
        self.inflight = InFlight()
        self._clock = threading.local()  # when the calling thread's request arrived (run)
        self._served = 0
        self._requests = 0
        self._hit_tokens = 0
        self._prompt_tokens = 0
        self._snapshots_stored = 0
        self._snapshot_hits = 0

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        block_size: int = 16,
        max_bytes: int = DEFAULT_MAX_BYTES,
        vision_entries: int = 64,
        cache_output: bool | None = None,
    ) -> Engine:
        """Load an mlx-vlm model directory (offline) and wrap it in an engine."""
        return cls(
            load_model(path),
            block_size=block_size,
            max_bytes=max_bytes,
            vision_entries=vision_entries,
            cache_output=cache_output,
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
            snapshots_stored=self._snapshots_stored,
            snapshot_hits=self._snapshot_hits,
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
            self._snapshots_stored = self._snapshot_hits = 0

    # -- the request path -------------------------------------------------------------------
    def run(self, request: Request, *, use_cache: bool = True, template: bool = True) -> Outcome:
        """Serve ``request``; with ``use_cache=False`` the caches are neither read nor written;
        ``template=False`` takes its text as the prompt, without the chat template.

        Safe to call from up to ``max_concurrency`` threads: requests in flight interleave
        by phase (render, admission, compute), MLX work one phase at a time (``_compute``),
        each request's forward on its own cache (never a padded batch: bit-exact against
        the request alone). Admission (``admit``) takes the pool's blocks in the order it
        reports as ``Outcome.served``; a request whose next block an earlier request in
        flight is writing waits for it (``InFlight``), so none reads a half-written block.
        ``Outcome.first_token_seconds`` counts from here to the prefill's logits."""
        self._clock.start = time.perf_counter()
        with self._compute:
            prepared = {
                img.digest: self.vision.prepare(
                    img, use_cache=use_cache, namespace=request.namespace
                )
                for img in request.images
            }
            rendered = self.render(request, prepared, use_cache=use_cache, template=template)
            keys = self.keys(rendered, request) if use_cache else []
        served, reuse, writing = self.admit(keys, rendered, request, use_cache=use_cache)
        try:
            with self._compute:
                out = self._serve(request, rendered, prepared, keys, reuse, use_cache)
            return out if served is None else dataclasses.replace(out, served=served)
        finally:
            with self._compute:
                self.pool.release(reuse.held)
                self.inflight.done(writing)
                self.kv.compact()

    def admit(
        self, keys: Sequence[BlockKey], rendered: Rendered, request: Request, *, use_cache: bool
    ) -> tuple[int | None, Reuse, list[bytes]]:
        """The admission of a cached request: its served index, what it reuses (blocks
        acquired) and the digests it announced it will write. When an earlier request in
        flight announced the block after the reused chain, wait for its writer, then look up
        again (``InFlight.wait``)."""
        if not use_cache:
            return None, Reuse(), []
        patient = True
        while True:
            with self._admission:  # the pool is thread-safe: admit while another computes
                reuse = self.lookup(keys, len(rendered.token_ids))
                if self.model.stateful_layers:
                    reuse = self.resume_point(reuse, rendered, keys, request)
                nxt = len(reuse.blocks)
                pending = self.inflight.writer(keys[nxt].digest) if nxt < len(keys) else None
                if pending is None or not patient:
                    served = self._served
                    self._served += 1
                    writing = self.inflight.announce([keys[nxt].digest] if nxt < len(keys) else [])
                    return served, reuse, writing
                self.pool.release(reuse.held)
                self.inflight.waits += 1
            # a writer that does not finish in time: compute the rows without it
            patient = pending.wait(self.in_flight_wait)

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
            marker=self.model.family.image_marker(),
            expand=self.model.family.expand_image,
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

    def boundaries(self, rendered: Rendered) -> list[int]:
        """Where this prompt's prefill is cut and its non-trimmable layers snapshotted."""
        m = self.model
        return boundaries(rendered.token_ids, rendered.spans, m.turn_start_id, m.header_end_id)

    def snapshot_key(
        self, keys: Sequence[BlockKey], rendered: Rendered, request: Request, position: int
    ) -> BlockKey:
        """The pool key of this prompt's snapshot at ``position``."""
        root = namespace_root(self.model.fingerprint, request.namespace)
        return snapshot_key(
            keys,
            rendered.token_ids,
            rendered.spans,
            position,
            block_size=self.block_size,
            root=root,
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
        hooks: dict[str, Any] = {}
        if self.model.stateful_layers:  # cut at every boundary, cold or warm
            hooks["cuts"] = [b - start for b in self.boundaries(rendered) if b > start]
            if use_cache:

                def at_cut(e: int) -> None:
                    self.snapshot(cache, keys, rendered, request, start + e)

                hooks["at_cut"] = at_cut

        def store() -> None:  # while MLX computes the last chunk: it reads that chunk's rows
            nonlocal stored
            stored = True
            self.store(cache, keys, start // self.block_size)

        hooks["meanwhile"] = getattr(keys, "complete", None)  # a KeyChain: hash the rest
        hooks["at_last_chunk"] = store if use_cache else None
        hooks = _accepted(self.prefill, hooks)
        logits = self.prefill(ids, start, embeds, cache, positions, **hooks)  # evaluated
        arrived = getattr(self._clock, "start", None)  # None: _serve called without run
        first_token = None if arrived is None else time.perf_counter() - arrived
        if "at_cut" in hooks:  # the prompt's end: a boundary of every prompt continuing it
            hooks["at_cut"](len(ids) - start)  # at a turn start or a turn's content
        if use_cache:
            if not stored:  # a prefill without the hooks, or one that never ran the model
                store()
            self.pool.touch(reuse.held)
            self._requests += 1
            self._hit_tokens += start
            self._prompt_tokens += len(ids)
        tokens, steps = self.decode(logits, cache, len(ids), delta, request.max_new_tokens)
        if use_cache and self.caches_output:
            self.store_output(cache, rendered, request, tokens)
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
            text=self.detokenize(tokens),
            first_token_seconds=first_token,
        )

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The reply as a chat client sees it: the tokens decoded, special tokens left out."""
        return str(self.model.tokenizer.decode(list(tokens), skip_special_tokens=True))

    def output_keys(self, rendered: Rendered, request: Request, tokens: Sequence[int]) -> KeyChain:
        """The block keys of the prompt continued by the output tokens whose KV the decode
        computed (all but the last: it is never fed back)."""
        root = namespace_root(self.model.fingerprint, request.namespace)
        ids = (*rendered.token_ids, *tokens[:-1])
        return KeyChain(ids, rendered.spans, block_size=self.block_size, root=root)

    def store_output(
        self, cache: list[Any], rendered: Rendered, request: Request, tokens: Sequence[int]
    ) -> None:
        """The prompt+output design: store the rows the decode computed, from the block the
        prompt ends in, under :meth:`output_keys` (the prompt's partial tail is superseded by
        the longer block)."""
        if len(tokens) < 2:
            return
        keys = self.output_keys(rendered, request, tokens)
        self.store(cache, keys, len(rendered.token_ids) // self.block_size)

    def restore(self, reuse: Reuse, capacity: int) -> list[Any]:
        """A fresh KV cache holding copies of the reused rows, in chain order, with room for
        ``capacity`` positions (prompt and decode), and copies of the snapshot's states."""
        cache = self.kv.restore([b.payload for b in reuse.blocks], reuse.tokens, capacity)
        if reuse.snapshot is not None:
            apply_snapshot(reuse.snapshot.payload, cache)
        return cache

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


def _accepted(prefill: Callable[..., mx.array], hooks: dict[str, Any]) -> dict[str, Any]:
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
