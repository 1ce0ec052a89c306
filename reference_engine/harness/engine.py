"""An in-process engine whose prefix cache is a paged engine's REAL block manager.

The block manager (and, when given, the scheduler) of a GPU engine decides which physical
blocks a sequence reads and writes and how many prompt tokens it reports as cached; the
reference model's forward (``model.py``) computes on CPU, reading the cached positions' KV
from those blocks and writing the computed rows into them (``paged.py``). Nothing is
simulated between the two: a block manager that hands out a block holding other content makes
the model read wrong KV, and the suite's equivalence check sees it.

``use_cache=False`` is the reference model's plain cold path (no block manager, no paged
store), so the baseline never shares a bug with the cache under test.

Images: the model merges each image's vision rows into its placeholders, as a VLM engine
does. A block manager that hashes token ids only (nano-vllm, ATOM) then keys two different
images of the same size identically, because their placeholder ids are identical; run with
``images=True`` only to show that (it is a finding for an engine that serves images with
such a cache), and text streams otherwise (``supports_images`` follows ``images``).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from pytest_prefixcache.errors import EngineError
from pytest_prefixcache.types import Outcome, Request

from ..engine import Engine as ReferenceEngine
from ..model import LoadedModel
from .batches import BatchRunner
from .driver import Sampling, drive, scheduler_config
from .paged import PagedKV

__all__ = ["BlockManagerEngine"]


class BlockManagerEngine:
    """The reference model served through a third-party block manager.

    Args:
        model: a loaded full-attention model (``load_model``).
        block_manager: the block manager class, or any callable ``(num_blocks, block_size)``
            returning one (nano-vllm's ``BlockManager``).
        sequence: the sequence class, or a callable ``(token_ids, sampling_params)`` (and
            ``images=`` digests, ``image_spans=`` ``(start, end, digest)`` placeholder runs,
            when it takes those keywords) returning one (nano-vllm's
            ``Sequence``; its ``block_size`` class attribute is set to ``block_size``).
        scheduler: optional scheduler class ``(config)`` (nano-vllm's ``Scheduler``): driven
            in its call order, its block manager replaced by a ``block_manager`` instance.
            Without it the block manager is driven alone (``driver.py``).
        num_blocks: physical blocks; small enough that blocks are recycled. Default ``256``.
        block_size: tokens per block. Default ``16``.
        images: pass images through (their placeholders are token ids like any other).
        batched_tokens: the scheduler's ``max_num_batched_tokens`` (default ``65536``); a
            smaller budget makes a chunking scheduler prefill long prompts in chunks.
        name: how reports name this engine.
    """

    reuse_reference = "block"
    supports_namespaces = False

    def __init__(
        self,
        model: LoadedModel,
        *,
        block_manager: Callable[..., Any],
        sequence: Callable[..., Any],
        scheduler: Callable[..., Any] | None = None,
        num_blocks: int = 256,
        block_size: int = 16,
        images: bool = False,
        batched_tokens: int = 1 << 16,
        name: str = "",
    ) -> None:
        if model.stateful_layers:
            raise EngineError(
                f"{model.path}: the block-manager harness serves full-attention models only "
                f"(this one has {model.model_type} layers whose state is not KV rows)"
            )
        sizes = (("num_blocks", num_blocks), ("block_size", block_size))
        for what, value in (*sizes, ("batched_tokens", batched_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise EngineError(f"{what} must be a positive int, got {value!r}")
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.batched_tokens = batched_tokens
        self.supports_images = images
        self.name = name or getattr(block_manager, "__qualname__", "block manager")
        self._make_block_manager = block_manager
        self._make_sequence = sequence
        self._make_scheduler = scheduler
        self._takes = _parameters(sequence) & {"images", "image_spans"}
        if isinstance(sequence, type) and hasattr(sequence, "block_size"):
            sequence.block_size = block_size  # nano-vllm: a class attribute, 256 by default
        self._ref = ReferenceEngine(model, block_size=block_size)
        self._lock = threading.RLock()
        self.reset()

    def reset(self) -> None:
        """A new block manager (and scheduler) and an empty paged store."""
        with self._lock:
            self.block_manager = self._make_block_manager(self.num_blocks, self.block_size)
            self.scheduler = None
            self.runner = BatchRunner()
            if self._make_scheduler is not None:
                config = scheduler_config(self.num_blocks, self.block_size, self.batched_tokens)
                self.scheduler = self._make_scheduler(config)
                self.scheduler.block_manager = self.block_manager
            self.paged = PagedKV(self.num_blocks, self.block_size)

    def run(self, request: Request, *, use_cache: bool = True) -> Outcome:
        if request.images and not self.supports_images:
            raise EngineError(f"{self.name}: this harness was built without images")
        if request.namespace:
            raise EngineError(f"{self.name}: a block manager without namespaces")
        if not use_cache:
            return self._ref.run(request, use_cache=False)
        with self._lock:
            return self._run_cached(request)

    def _run_cached(self, request: Request) -> Outcome:
        ref, model = self._ref, self.model
        prepared = {img.digest: ref.vision.prepare(img, use_cache=False) for img in request.images}
        rendered = ref.render(request, prepared, use_cache=False)
        ids = list(rendered.token_ids)
        grids = [prepared[img.digest].grid for img in rendered.images]
        positions, delta = model.positions(ids, grids)
        # a sequence samples one token at least; the Outcome keeps max_new_tokens of them
        sampling = Sampling(max_tokens=max(1, request.max_new_tokens))
        kwargs: dict[str, Any] = {
            "images": [img.digest for img in rendered.images],
            "image_spans": list(rendered.spans),
        }
        kwargs = {k: v for k, v in kwargs.items() if k in self._takes}
        seq = self._make_sequence(ids, sampling, **kwargs)
        logits_at: dict[int, np.ndarray] = {}  # position -> the logits predicting its token
        state: dict[str, Any] = {}

        def step(
            seq: Any,
            start: int,
            end: int,
            prefill: bool,
            *,
            table: Any = None,
            tokens: list[int] | None = None,
            images: bool = True,
        ) -> int | None:
            """The model runner on one row: ``table``, ``tokens`` and ``images`` (does the
            batch carry this row's image data?) are what a batch scheduler's batch says;
            without them the sequence's own block table and tokens are read."""
            if end <= start:
                raise EngineError(
                    f"{self.name}: the block manager reported {start} of {len(ids)} prompt "
                    f"tokens as cached: no position left to compute the next token's logits"
                )
            table = list(seq.block_table if table is None else table)
            cache = model.restore(self.paged.windows(table, start), start, end)
            if prefill:
                if end > len(ids) or start < state.get("first", start):
                    raise EngineError(
                        f"{self.name}: the scheduler prefills positions [{start}, {end}) again "
                        f"(a preempted sequence: no free block to decode into; give it more "
                        f"than {self.num_blocks} blocks)"
                    )
                if "embeds" not in state:  # the rows of every position the manager did not cache
                    state["first"] = start
                    state["embeds"], state["merges"] = ref.suffix_embeddings(
                        rendered, prepared, start, use_cache=False
                    )
                first = state["first"]
                chunk = ids[start:end] if tokens is None else list(tokens)
                if images and chunk == ids[start:end]:
                    embeds = state["embeds"][start - first : end - first]
                else:  # the runner's text path: placeholders embedded as plain tokens
                    embeds = model.embed(chunk)
                    if any(a < end and b > start for a, b, *_ in rendered.spans):
                        state["merges"] = []  # this chunk's image rows were never merged
                pos = None if positions is None else positions[:, :, start:end]
            else:
                chunk = [int(seq.last_token)] if tokens is None else list(tokens)
                embeds = model.embed(chunk)
                pos = model.family.step_positions(start + delta)
            logits = model.forward(chunk, embeds, cache, pos)
            self.paged.write(table, cache, start, end)
            if prefill and end < len(ids):
                return None
            logits_at[end] = np.array(logits)  # a recomputed position: its latest logits
            return int(np.argmax(logits_at[end]))

        cached = drive(
            seq,
            step,
            block_manager=self.block_manager,
            scheduler=self.scheduler,
            prompt_len=len(ids),
            eos=model.eos_token_ids,
            runner=self.runner,
        )
        # the tokens the engine emitted (its sequence's completion), each with the logits the
        # model computed for its position
        kept = tuple(int(t) for t in list(seq.token_ids)[len(ids) : len(seq)])
        kept = kept[: request.max_new_tokens]
        missing = [len(ids) + k for k in range(max(1, len(kept))) if len(ids) + k not in logits_at]
        if missing:
            raise EngineError(
                f"{self.name}: the engine emitted tokens at positions {missing} (prompt of "
                f"{len(ids)}) that the model never computed logits for"
            )
        steps = [logits_at[len(ids) + k] for k in range(max(1, len(kept)))]
        return Outcome(
            logits=steps[0],
            tokens=kept,
            step_logits=tuple(steps[: len(kept)]),
            cached_tokens=cached,
            prompt_tokens=len(ids),
            token_ids=tuple(ids),
            image_spans=rendered.spans,
            merges=tuple(state.get("merges", ())),
            message_starts=rendered.message_starts,
        )


def _parameters(fn: Callable[..., Any]) -> set[str]:
    try:
        target = fn.__init__ if isinstance(fn, type) else fn  # type: ignore[misc]
        return set(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return set()
