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
there by itself). No decode rule: decode-time KV is reused only on full-attention models,
where decode and prefill agree bit for bit (``benchmarks/decode_tolerance.py``); a model with
sliding-window or recurrent layers resumes at snapshots, never inside a reply.

Each step is a method, so a mutant (``reference_engine.mutants``) can break exactly one.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_prefixcache.types import Outcome, Request

from .blocks import BlockKey, KeyChain, namespace_root
from .compute import Compute, accepted_hooks
from .designs import (
    CACHE_DESIGNS,
    CACHE_ENV,
    DEFAULT_MAX_BYTES,
    OutputDesign,
    cache_output_from_env,
)
from .disk import DEFAULT_DISK_BYTES
from .inflight import IN_FLIGHT_WAIT, InFlight
from .kv import KVStore
from .kvquant import KVQuant, QuantizedKV, kv_quant_from_env
from .lora import Adapters
from .model import LoadedModel, default_model_path, load_model
from .persist import Persist
from .pool import BlockPool, Reuse
from .render import Rendered, render
from .resume import Resume, checked_step
from .speculative import Speculate, Speculative, checked, speculative_from_env
from .stats import Counters, EngineStats
from .tokens import PieceTokenizer
from .vision import Prepared, VisionCache

__all__ = [
    "CACHE_DESIGNS",
    "CACHE_ENV",
    "DEFAULT_MAX_BYTES",
    "Engine",
    "EngineStats",
    "cache_output_from_env",
    "default_model_path",
]


class Engine(Persist, Resume, Compute, OutputDesign, Speculate, QuantizedKV, Adapters, Counters):
    """A reference MLX engine with a chained-hash, image-aware block prefix cache.

    Args:
        model: a loaded model (see ``Engine.from_pretrained``).
        block_size: tokens per block. Default: ``16``.
        max_bytes: byte budget of stored KV blocks. Default: ``DEFAULT_MAX_BYTES``.
        vision_entries: images whose embeddings are kept. Default: ``64``.
        cache_output: also store the KV computed while decoding, under the prompt + output
            tokens (the ``prompt+output`` design). Default: ``PREFIXCACHE_REFERENCE_CACHE``,
            else ``False`` (``prompt``: the prompt's KV only).
        cache_dir: a storage directory for the disk tier (``persist.py``); a new engine over
            the same directory restores what an earlier one stored. Default: ``None`` (none).
        disk_bytes: byte budget of the disk tier. Default: ``DEFAULT_DISK_BYTES``.
        speculative: decode by draft-then-verify with this draft (``speculative.py``).
            Default: ``PREFIXCACHE_REFERENCE_DRAFT``, else none.
        kv_quant: quantize the KV rows (``kvquant.py``). Default:
            ``PREFIXCACHE_REFERENCE_KV_BITS`` and its companions, else off.
        adapters: LoRA adapters requests may name, name -> folder, or ``"fixture"`` (the
            model's fixture adapter as ``lora``; ``lora.py``). Default:
            ``PREFIXCACHE_REFERENCE_ADAPTERS``, else none.
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
        cache_dir: str | os.PathLike[str] | None = None,
        disk_bytes: int = DEFAULT_DISK_BYTES,
        speculative: Speculative | None = None,
        kv_quant: KVQuant | None = None,
        prefill_step: int | None = None,
        adapters: Mapping[str, str | os.PathLike[str]] | str | None = None,
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
        self.prefill_step = checked_step(prefill_step)
        self.speculative = (
            speculative_from_env(model) if speculative is None else checked(speculative, model)
        )
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
        self._roots: dict[tuple[str, str | None], bytes] = {}  # (namespace, adapter) -> root
        self.kv_quant: KVQuant | None = None
        self.set_kv_quant(kv_quant_from_env() if kv_quant is None else kv_quant)
        self.load_adapters(adapters)
        self.open_disk(cache_dir, disk_bytes, block_size=block_size, max_bytes=max_bytes,
                       vision_entries=vision_entries, cache_output=cache_output,
                       prefill_step=prefill_step,
                       adapters={n: a.path for n, a in self.loras.items()})  # fmt: skip

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        block_size: int = 16,
        max_bytes: int = DEFAULT_MAX_BYTES,
        vision_entries: int = 64,
        cache_output: bool | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        kv_quant: KVQuant | None = None,
    ) -> Engine:
        """Load an mlx-vlm model directory (offline) and wrap it in an engine."""
        return cls(
            load_model(path),
            block_size=block_size,
            max_bytes=max_bytes,
            vision_entries=vision_entries,
            cache_output=cache_output,
            cache_dir=cache_dir,
            kv_quant=kv_quant,
        )

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
            self.reset_disk()

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
                img.digest: self.vision.prepare(img, use_cache=use_cache, namespace=request.scope)
                for img in request.images
            }
            rendered = self.render(request, prepared, use_cache=use_cache, template=template)
            keys = self.keys(rendered, request) if use_cache else []
        served, reuse, writing = self.admit(keys, rendered, request, use_cache=use_cache)
        try:
            with self._compute, self.adapted(request.adapter):
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
        """Token ids and image spans, cached runs tokenised piece by piece (``tokens.py``); on a
        model with non-trimmable layers, the prompt's boundaries (``boundaries``) too."""
        rendered = render(
            request,
            processor=self.model.processor,
            image_token_id=self.model.image_token_id,
            placeholder_count=lambda img: prepared[img.digest].count,
            encode=(
                functools.partial(self.tokens.encode, namespace=request.scope)
                if use_cache and self.tokens is not None
                else None
            ),
            template=template,
            marker=self.model.family.image_marker(),
            expand=self.model.family.expand_image,
        )
        if not self.model.stateful_layers:
            return rendered
        return dataclasses.replace(rendered, boundaries=tuple(self.boundaries(rendered)))

    def keys(self, rendered: Rendered, request: Request) -> Sequence[BlockKey]:
        """The prompt's block keys, hashed as the lookup needs them (the rest during the
        prefill, see ``prefill``)."""
        root = self.root(request.namespace, request.adapter)
        return KeyChain(rendered.token_ids, rendered.spans, block_size=self.block_size, root=root)

    def root(self, namespace: str, adapter: str | None = None) -> bytes:
        """The parent key of block 0 in ``namespace`` with ``adapter`` (``namespace_root`` of
        the identity with the adapter's, ``lora.py``), hashed once."""
        root = self._roots.get((namespace, adapter))
        if root is None:
            identity = dataclasses.replace(self.identity, adapter=self.adapter_identity(adapter))
            root = self._roots[(namespace, adapter)] = namespace_root(
                identity.digest, namespace, *self.kv_key()
            )
        return root

    def lookup(self, keys: Sequence[BlockKey], prompt_len: int) -> Reuse:
        """What the pool lets this prompt reuse (``BlockPool.reuse``), its blocks acquired
        (first the chain's next blocks back from disk, ``Persist.promote``)."""
        if self.persists:
            self.promote(keys)
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
        hooks: dict[str, Any] = {}
        if self.model.stateful_layers:  # cut at every boundary (and chunk end), cold or warm
            bounds = self.boundaries(rendered)
            hooks["cuts"] = self.prefill_cuts(bounds, start, len(ids))
            if use_cache:
                at = {*bounds, len(ids)}  # not at a chunk end

                def at_cut(e: int) -> None:
                    if start + e in at:
                        self.snapshot(cache, keys, rendered, request, start + e)

                hooks["at_cut"] = at_cut

        def store() -> None:  # while MLX computes the last chunk: it reads that chunk's rows
            nonlocal stored
            stored = True
            self.store(cache, keys, start // self.block_size)

        hooks["meanwhile"] = getattr(keys, "complete", None)  # a KeyChain: hash the rest
        hooks["at_last_chunk"] = store if use_cache else None
        hooks = accepted_hooks(self.prefill, hooks)
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
        speculated = self.speculative is not None and use_cache  # cold: plain greedy
        if not speculated:
            tokens, steps = self.decode(logits, cache, len(ids), delta, request.max_new_tokens)
            if use_cache and self.caches_output:
                self.store_output(cache, rendered, request, tokens)
        else:  # draft-then-verify; the output rows stored are those the decode left
            max_new = request.max_new_tokens
            tokens, steps = self.speculate(logits, cache, ids, delta, max_new, self.interleave)
            if use_cache and self.caches_output:
                self.store_decoded(cache, rendered, request, tokens)
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
            speculated=speculated,
        )

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The reply as a chat client sees it: the tokens decoded, special tokens left out."""
        return str(self.model.tokenizer.decode(list(tokens), skip_special_tokens=True))
