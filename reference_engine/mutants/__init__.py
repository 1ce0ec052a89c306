"""The bug zoo: one mutant of the reference engine per real-world prefix-cache bug class.

Each mutant is an ``Engine`` subclass that overrides the one step it breaks (keys, lookup,
restore, vision merge, prefill positions, store, render or bookkeeping); its docstring names
the public issue or commit it reproduces (see ../shared/BUG_ZOO.md). Mutants are off by
default and selected by name, for example::

    pytest --prefixcache-verify --prefixcache-engine=reference_engine.mutants:placeholder_collision

``MUTANTS`` maps each name to a :class:`Mutant`: its bug class, what it breaks, the check
expected to catch it, and a zero-argument factory (the mutant on the default fixture).
``python -m reference_engine.mutants --table`` prints the detection table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pytest_prefixcache.package_data import model_from_env

from ..engine import Engine
from ..fixtures.qwen2_vl import QWEN2_VL_DIR
from ..kvquant import KVQuant
from ..lora import FIXTURE
from ..model import LoadedModel, shared_model
from .accounting import (
    SMALL_BUDGET,
    EvictsInUse,
    LyingHitCount,
    NeverStores,
    SlowRestore,
    ZeroByteAccounting,
)
from .chunked import SnapshotAtChunkEnd
from .concurrency import EvictInUse, RaggedBatch, RaggedDecode, ReadBeforeWrite, WrongBatchRow
from .keys import (
    ImageOrderIgnored,
    NamespaceMissing,
    PlaceholderCollision,
    UnchainedBlocks,
    WeakImageHash,
)
from .kvquant import KvBitsNotKeyed, KvStartOffByOneBlock
from .layers import (
    LayersOutOfStep,
    RecurrentTrimmed,
    RingTrimmedAfterWrap,
    SlotNotReset,
    SnapshotIncludesOutput,
    SnapshotOffByOne,
)
from .merge import PartialImageCrash, PartialImageMerge
from .outputs import OutputKvOffByOne
from .persist import DtypeNotRestored, ModelDigestMissing, TornWriteServed
from .prompts import HistoryRerendered, VolatileHeaderKept
from .shared_kv import SharedKvSlotStale
from .speculation import RecurrentNotRolledBack, RejectedDraftKept
from .state import (
    AliasedLiveCache,
    EmptySuffixRefeed,
    MropeRestart,
    SnapshotAfterDecode,
    SnapshotBeforePrefill,
)
from .tenants import AdapterNotKeyed, SaltDroppedForImages

__all__ = ["MUTANTS", "PROTOCOL_CHECKS", "Mutant"]

#: The fixtures the layer mutants need (``reference_engine.fixtures``).
QWEN3_5_VL = "tiny-qwen3.5-vl"
GEMMA3 = "tiny-gemma3"
GEMMA4 = "tiny-gemma4"

#: The checks ``--prefixcache-verify`` runs (the ``check`` of its failures). A mutant whose
#: expected check is not one of these needs an observation the protocol does not carry yet.
PROTOCOL_CHECKS = frozenset(
    {
        "equivalence",
        "shapes",
        "reuse bound",
        "isolation",
        "positive control",
        "min efficiency",
        "render stability",
        "render hygiene",
        "min speedup",
        "fault",
        "memory budget",
        "stale identity",
    }
)


@dataclass(frozen=True)
class Mutant:
    """One bug-zoo entry.

    Attributes:
        name: the attribute name (``reference_engine.mutants:NAME``).
        bug_class: the row of BUG_ZOO.md it reproduces.
        breaks: what it does wrong, in one line.
        expected_check: the check that must catch it.
        engine_class: the Engine subclass.
        options: keyword arguments for the engine (e.g. ``block_size``).
        verify: ``VerifyOptions`` fields the check needs (opt-in checks such as
            ``min_speedup``); see :attr:`flags` for the command-line equivalent.
        model: the fixture it is built on by default: one of the family whose layers it
            breaks (a sliding-window or recurrent mutant has nothing to break on a
            full-attention model).
        switch: a KV setting the detection switches the engine to around every cached
            request (``kvquant.SwitchingKV``): a bug that shows only after a switch.
    """

    name: str
    bug_class: int
    breaks: str
    expected_check: str
    engine_class: type[Engine]
    options: dict[str, Any] = field(default_factory=dict)
    verify: dict[str, float | bool] = field(default_factory=dict)
    model: str = QWEN2_VL_DIR
    switch: KVQuant | None = None

    @property
    def flags(self) -> tuple[str, ...]:
        """The ``--prefixcache-*`` options that enable :attr:`verify`."""
        return tuple(
            f"--prefixcache-{k.replace('_', '-')}" + ("" if v is True else f"={v:g}")
            for k, v in self.verify.items()
        )

    @property
    def source(self) -> str:
        """The sentence of the docstring that names the public issues it reproduces."""
        doc = " ".join((self.engine_class.__doc__ or "").split())
        at = doc.find("Reproduces ")
        return "" if at < 0 else doc[at + len("Reproduces ") :].split(". ")[0].rstrip(".")

    def build(self, model: LoadedModel | None = None, **overrides: Any) -> Engine:
        """The mutant on ``model`` (default: the process's shared load, ``shared_model``, of
        the model ``PREFIXCACHE_MODEL`` names, set by ``--prefixcache-model``, else of its own
        fixture, :attr:`model`): a fresh mutant is a fresh cache, not a fresh load."""
        opts = {**self.options, **overrides}
        if model is None:
            model = shared_model(model_from_env(self.model))
        return self.engine_class(model, **opts)

    @property
    def factory(self) -> Callable[[], Engine]:
        """A zero-argument callable returning the mutant on its fixture."""

        def build() -> Engine:
            return self.build()

        build.__name__ = build.__qualname__ = self.name
        build.__doc__ = self.engine_class.__doc__
        return build


_ALL = (
    Mutant("placeholder_collision", 1, "block keys ignore image digests", "equivalence",
           PlaceholderCollision),
    Mutant("partial_image_merge", 2, "all rows of a partly cached image merged into the "
           "remaining slots (slots != rows)", "shapes", PartialImageMerge),
    Mutant("partial_image_crash", 2, "the same merge raises a shape mismatch", "fault",
           PartialImageCrash),
    Mutant("weak_image_hash", 4, "images keyed by a shape-blind 64-bit XOR fold of their "
           "bytes", "equivalence", WeakImageHash),
    Mutant("image_order_ignored", 5, "image digests sorted before keying", "equivalence",
           ImageOrderIgnored),
    Mutant("unchained_blocks", 6, "each block keyed by its own content, not its chain",
           "equivalence", UnchainedBlocks),
    Mutant("snapshot_before_prefill", 7, "blocks stored from the KV as it was before "
           "prefill (zeros)", "equivalence", SnapshotBeforePrefill),
    Mutant("snapshot_after_decode", 7, "last stored block holds one row too many "
           "(cache_offset = prompt_len + 1)", "equivalence", SnapshotAfterDecode),
    Mutant("output_kv_off_by_one", 7, "prompt+output design: the decode's KV rows stored "
           "one position off (row p - 1 under the key of p)", "equivalence", OutputKvOffByOne,
           {"cache_output": True}),
    Mutant("empty_suffix_refeed", 8, "exact repeat: last token fed again on top of the "
           "whole prompt's KV", "equivalence", EmptySuffixRefeed, {"block_size": 1}),
    Mutant("aliased_live_cache", 9, "stored blocks are windows on a live cache that later "
           "requests write into", "equivalence", AliasedLiveCache),
    Mutant("wrong_batch_row", 10, "rows stored from another request in flight (a "
           "decoding batch row)", "equivalence", WrongBatchRow),
    Mutant("read_before_write", 10, "blocks published before the prefill wrote them; a "
           "request in flight reuses the zeros", "equivalence", ReadBeforeWrite),
    Mutant("evict_in_use", 10, "blocks another request in flight holds evicted, their "
           "memory reused", "equivalence", EvictInUse, {"max_bytes": SMALL_BUDGET}),
    Mutant("ragged_batch", 10, "cached prefixes of different lengths batched left-padded, "
           "the padding attended (no mask)", "equivalence", RaggedBatch),
    Mutant("ragged_decode", 10, "decode steps after the first token take the batch's "
           "length as a shorter row's position", "equivalence", RaggedDecode),
    Mutant("namespace_missing", 11, "namespace left out of the key root", "isolation",
           NamespaceMissing),
    Mutant("adapter_not_keyed", 11, "block keys without the adapter: a request with the "
           "fixture adapter reuses the base model's KV", "isolation", AdapterNotKeyed,
           options={"adapters": FIXTURE}),
    Mutant("salt_dropped_for_images", 11, "the namespace (salt) left out of the keys of "
           "prompts with images only (a tenant's own text prefix is then missed)",
           "positive control", SaltDroppedForImages),
    Mutant("volatile_header_kept", 12, "per-request billing header rendered into the "
           "system prompt", "render hygiene", VolatileHeaderKept,
           verify={"strict_render": True}),
    Mutant("history_rerendered", 13, "latest reply re-rendered once a turn is added",
           "render hygiene", HistoryRerendered, verify={"strict_render": True}),
    Mutant("mrope_restart", 15, "suffix positions continue from the cache offset without "
           "the rope delta", "equivalence", MropeRestart),
    Mutant("ring_trimmed_after_wrap", 16, "a wrapped sliding-window ring trimmed back as if "
           "it were linear", "equivalence", RingTrimmedAfterWrap, model=GEMMA3),
    Mutant("layers_out_of_step", 16, "full-attention layers resume at the match, sliding "
           "windows at the snapshot before it", "equivalence", LayersOutOfStep, model=GEMMA3),
    Mutant("recurrent_trimmed", 17, "a recurrent state 'trimmed' to the shared prefix "
           "without rewinding", "equivalence", RecurrentTrimmed, model=QWEN3_5_VL),
    Mutant("snapshot_includes_output", 17, "the prompt-end snapshot taken after decoding, "
           "keyed by the prompt", "equivalence", SnapshotIncludesOutput, model=QWEN3_5_VL),
    Mutant("snapshot_off_by_one", 17, "the state after position p stored as the state "
           "after p - 1", "equivalence", SnapshotOffByOne, model=QWEN3_5_VL),
    Mutant("slot_not_reset", 17, "a recurrent state slot handed to the next request "
           "without reset", "equivalence", SlotNotReset, model=QWEN3_5_VL),
    Mutant("kv_bits_not_keyed", 18, "KV bits left out of the cache key: 8-bit blocks "
           "served after a switch to 4 bits", "equivalence", KvBitsNotKeyed,
           {"kv_quant": KVQuant(8, 0, 0)}, switch=KVQuant(4)),
    Mutant("kv_start_off_by_one_block", 18, "a cache hit quantizes from the block before "
           "the quantized start", "equivalence", KvStartOffByOneBlock,
           {"kv_quant": KVQuant(4, 0, 16)}),
    Mutant("zero_byte_accounting", 20, "blocks counted as 0 bytes: budget never enforced",
           "memory budget", ZeroByteAccounting),
    Mutant("evicts_in_use", 20, "in-use blocks evicted; their memory reused while still "
           "indexed", "equivalence", EvictsInUse, {"max_bytes": SMALL_BUDGET}),
    Mutant("slow_restore", 21, "restoring a hit costs more than recomputing it",
           "min speedup", SlowRestore, verify={"min_speedup": 1.0}),
    Mutant("never_stores", 22, "store fails silently: nothing is ever cached",
           "positive control", NeverStores),
    Mutant("rejected_draft_kept", 26, "speculative decoding: the last round's rejected "
           "drafts' KV kept, stored under the reply's tokens", "equivalence",
           RejectedDraftKept),
    Mutant("recurrent_not_rolled_back", 26, "speculative decoding on a hybrid: recurrent "
           "states keep the rejected drafts' updates", "equivalence", RecurrentNotRolledBack,
           model=QWEN3_5_VL),
    Mutant("lying_hit_count", 22, "vision-cache hits counted as cached prompt tokens",
           "reuse bound", LyingHitCount),
    Mutant("model_digest_missing", 25, "disk keys without the model's weights digest: a "
           "restart with other weights restores the old KV", "stale identity",
           ModelDigestMissing),
    Mutant("dtype_not_restored", 25, "disk keys without the KV dtype; rows restored in the "
           "dtype they were stored in", "stale identity", DtypeNotRestored),
    Mutant("torn_write_served", 25, "blocks written in place and read unchecked: a write "
           "torn by a restart served as a hit", "equivalence", TornWriteServed),
    Mutant("shared_kv_slot_stale", 27, "KV-shared layers read a slot of their own, not "
           "restored on a hit: the last request's rows", "equivalence", SharedKvSlotStale,
           model=GEMMA4),
    Mutant("snapshot_at_chunk_end", 28, "a prefill in chunks of 32 snapshots at chunk ends only: "
           "the state after the chunk filed under each boundary inside it", "equivalence",
           SnapshotAtChunkEnd, {"prefill_step": 32}, model=QWEN3_5_VL),
)  # fmt: skip

MUTANTS: dict[str, Mutant] = {m.name: m for m in _ALL}


def __getattr__(name: str) -> Callable[[], Engine]:
    mutant = MUTANTS.get(name)
    if mutant is None:
        raise AttributeError(
            f"module {__name__!r} has no mutant {name!r}; known: {', '.join(MUTANTS)}"
        )
    return mutant.factory


def __dir__() -> list[str]:
    return sorted([*globals(), *MUTANTS])
