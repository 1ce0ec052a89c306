"""Mutants of cache bookkeeping: classes 20, 21 and 22 of the bug zoo.

Their answers are right. They break the budget, the speed, or the truth of the counters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pytest_prefixcache.types import Outcome, Request

from ..blocks import BlockKey
from ..engine import Engine
from ..model import LoadedModel
from ..pool import Block, BlockPool, Reuse
from ..render import Rendered
from ..vision import Prepared

__all__ = [
    "SMALL_BUDGET",
    "EvictsInUse",
    "LyingHitCount",
    "NeverStores",
    "SlowRestore",
    "ZeroByteAccounting",
]

#: How many times SlowRestore recomputes a request before serving a hit from the cache.
SLOW_TIER_RECOMPUTES = 2
#: A pool of about 16 blocks of the default fixture (8 KiB each): eviction in every stream.
SMALL_BUDGET = 128 * 1024


class _ZeroBytePool(BlockPool):
    def insert(self, key: BlockKey, payload: Any, nbytes: int) -> Block | None:
        # BUG: every entry is counted as 0 bytes, so the budget never evicts anything.
        return super().insert(key, payload, 0)


class ZeroByteAccounting(Engine):
    """Class 20, eviction accounting: every stored block is counted as 0 bytes.

    The byte budget is never enforced: the pool grows without bound (on a GPU: Metal OOM)
    while ``resident_bytes`` reports 0. Reproduces ml-explore/mlx-vlm #1901 (a cache entry
    counted as 0 bytes) and waybarrios/vllm-mlx #541 and #683.
    """

    def __init__(self, model: LoadedModel, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.pool = _ZeroBytePool(self.pool.max_bytes)


class _InUseEvictingPool(BlockPool):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self._recycled: list[Block] = []

    def _make_room(self, nbytes: int) -> bool:
        for digest, block in list(self._blocks.items()):
            if self._bytes + nbytes <= self.max_bytes:
                break
            if block.refcount == 0:
                self._bytes -= self._blocks.pop(digest).nbytes
                self.stats.evictions += 1
            elif block.nbytes:
                # BUG: a block in use is evicted too: its memory goes to the next new block,
                # but it stays in the index (it is dropped on release, which forgets to).
                self._bytes -= block.nbytes
                block.nbytes = 0
                self._recycled.append(block)
        return self._bytes + nbytes <= self.max_bytes

    def insert(self, key: BlockKey, payload: Any, nbytes: int) -> Block | None:
        block = super().insert(key, payload, nbytes)
        if block is not None and block.payload is payload:
            for i, old in enumerate(self._recycled):
                if old.payload.rows == payload.rows:  # a free slot of the same size
                    slot = self._recycled.pop(i).payload  # now holds the new block's rows
                    slot.segment, slot.offset = payload.segment, payload.offset
                    break

        return block

    def clear(self) -> None:
        super().clear()
        self._recycled.clear()


class EvictsInUse(Engine):
    """Class 20, eviction accounting: under memory pressure the pool evicts blocks that a
    running request still holds; their memory is reused for new blocks while their keys stay
    in the index, so a later hit on them reads another block's KV.

    Runs with a small pool (``SMALL_BUDGET``) so that every stream evicts. Reproduces the
    eviction bugs of waybarrios/vllm-mlx #541 and #683 (agents evicting each other's entries
    mid-request) and ml-explore/mlx-vlm #1901 (cache accounting that frees live entries).
    """

    def __init__(self, model: LoadedModel, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.pool = _InUseEvictingPool(self.pool.max_bytes)


class SlowRestore(Engine):
    """Class 21, cache slower than no cache: restoring a hit costs more than the prefill it
    saves: the slow tier costs what computing the whole request ``SLOW_TIER_RECOMPUTES``
    times costs (the same kind of work as a cold run, so a hit is slower than no cache however
    loaded the machine is; a fixed sleep was not, on a busy CI machine).

    Answers and reuse counts are right; time to first token with a hit is above the cold
    one. Reproduces jundot/omlx #637 (TTFT 72 s vs 7 s warm with photos of different sizes)
    and #3064, ml-explore/mlx-vlm #2210.
    """

    def _serve(
        self,
        request: Request,
        rendered: Rendered,
        prepared: dict[str, Prepared],
        keys: Sequence[BlockKey],
        reuse: Reuse,
        use_cache: bool,
    ) -> Outcome:
        if reuse.tokens:
            # BUG: reading the hit back costs more than recomputing it.
            for _ in range(SLOW_TIER_RECOMPUTES):
                super()._serve(request, rendered, prepared, [], Reuse(), use_cache=False)
        return super()._serve(request, rendered, prepared, keys, reuse, use_cache)


class NeverStores(Engine):
    """Class 22, invisible failure: storing fails on every request and the exception is
    swallowed, so the cache stays empty: 0% hits, no error.

    Reproduces ml-explore/mlx-vlm #1287 (blocks stored only once the generator is consumed,
    which callers never did), ROCm/ATOM #939 and jundot/omlx #1901.
    """

    def store(self, cache: list[Any], keys: Sequence[BlockKey], first: int) -> None:
        try:
            raise RuntimeError("the stream was closed before the cache was saved")
        except RuntimeError:
            pass  # BUG: the failure is swallowed; nothing is stored, nothing is reported.


class LyingHitCount(Engine):
    """Class 22, invisible failure: the hit counter lies. Image placeholders whose embedding
    rows came from the vision cache are counted as cached prompt tokens.

    The KV reuse is right but ``cached_tokens`` claims more than could validly be reused
    (the same image in a new conversation, or in another namespace). Reproduces the
    misleading hit metrics of ROCm/ATOM #939 and jundot/omlx #1901.
    """

    def run(self, request: Request, *, use_cache: bool = True, template: bool = True) -> Outcome:
        if not use_cache:
            return super().run(request, use_cache=False, template=template)
        ns = request.namespace
        prepared = (self.vision.prepare(i, namespace=ns) for i in request.images)
        seen = {i.digest for i, p in zip(request.images, prepared) if p.rows is not None}
        out = super().run(request, use_cache=True, template=template)
        if not out.image_spans or out.cached_tokens is None:
            return out
        # BUG: vision-cache hits are added to the prompt-cache hit count.
        extra = sum(
            e - max(s, out.cached_tokens)
            for s, e, d in out.image_spans
            if d in seen and e > out.cached_tokens
        )
        return dataclasses.replace(out, cached_tokens=out.cached_tokens + extra)
