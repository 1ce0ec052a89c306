"""A stand-in for ATOM's scheduler (ROCm/ATOM ``atom/model_engine/scheduler.py``), written here
from its interface (ATOM needs torch and a ROCm GPU to import): ``schedule()`` returns a
``ScheduledBatch`` built from its sequences and the sequences by id, the model runner answers
with a ``ScheduledBatchOutput`` whose tokens are deferred one forward (ATOM's default), and
``postprocess(seqs, output, batch=batch)`` hashes the prefill chunk's full blocks, advances
``num_cached_tokens``, drops the stale token of a chunk that ended a partial prefill, puts
each delivered token in its placeholder, appends a new placeholder, frees finished sequences.
Chunked prefill, one sequence per batch, no preemption; the block manager is nano-vllm's
stand-in (``block_manager_standin``), keyed by images through the sequence's blocks.

Images: ATOM's ``ScheduledBatch`` moves a sequence's ``multimodal_data`` into the batch; this
one copies it into every prefill chunk's batch of the sequence, so that each chunk's
placeholders get their image rows. A block's key holds, after its token ids, the digest and
offset of every image placeholder run in it (``Sequence.block``), as vLLM's extra keys do.

The planted bugs (negative controls) are subclasses that break one rule each, in the batch or
the post-processing, where a block manager alone never looks.
"""

from __future__ import annotations

import hashlib
from collections import deque
from enum import Enum, auto
from typing import Any

import numpy as np
from block_manager_standin import BlockManager, SequenceStatus
from block_manager_standin import Sequence as _Sequence


class SequenceType(Enum):
    PREFILL = auto()
    DECODE = auto()


class Sequence(_Sequence):
    def __init__(
        self,
        token_ids: list[int],
        sampling_params: Any,
        image_spans: list[tuple[int, int, str]] | None = None,
    ) -> None:
        super().__init__(token_ids, sampling_params)
        self.id = self.seq_id
        self.type = SequenceType.PREFILL
        spans = list(image_spans or ())
        self.multimodal_data = {"images": [d for _, _, d in spans]} if spans else None
        self.image_spans = spans  # kept: the block keys need them after the batch
        self.is_partial_prefill = False
        self.leave_reason = ""

    def block(self, i: int) -> list[int]:
        """The block's token ids, then a key per image placeholder run it holds (the image's
        digest and the run's offset in the image): the block manager hashes and compares
        these, so two images' placeholders never key alike."""
        a, b = i * self.block_size, (i + 1) * self.block_size
        keys = [
            int.from_bytes(
                hashlib.blake2b(f"{d}:{max(a, s) - s}".encode(), digest_size=7).digest(), "little"
            )
            for s, e, d in self.image_spans
            if s < b and e > a
        ]
        return super().block(i) + keys


class ScheduledBatch:
    def __init__(self, seqs: dict[int, Sequence], counts: list[int], prefill: bool) -> None:
        self.req_ids = list(seqs)
        self.num_scheduled_tokens = np.asarray(counts, dtype=np.int32)
        self.total_seqs_num_prefill = len(seqs) if prefill else 0
        self.num_cached_tokens = [seq.num_cached_tokens for seq in seqs.values()]
        self.context_lens = np.asarray(
            [
                seq.num_cached_tokens + n if prefill else seq.num_tokens
                for seq, n in zip(seqs.values(), counts)
            ],
            dtype=np.int32,
        )
        tokens: list[int] = []
        for seq, n in zip(seqs.values(), counts):
            first = seq.num_cached_tokens if prefill else seq.num_tokens - n
            tokens += seq.token_ids[first : first + n]
        self.scheduled_tokens = np.asarray(tokens, dtype=np.int32)
        self.block_tables = [seq.block_table for seq in seqs.values() if seq.block_table]
        self.multimodal_data = self.take_images(seqs, prefill)

    def take_images(self, seqs: dict[int, Sequence], prefill: bool) -> dict[int, Any]:
        return {
            seq.id: seq.multimodal_data
            for seq in seqs.values()
            if prefill and seq.multimodal_data is not None
        }


class ScheduledBatchOutput:
    def __init__(
        self,
        req_ids: list[int],
        token_ids: list[tuple[int, ...]],
        num_rejected: Any,
        num_bonus: Any,
        draft_token_ids: Any,
        is_deferred_out: bool = False,
    ) -> None:
        self.req_ids = list(req_ids)
        self.token_ids = list(token_ids)
        self.is_deferred_out = is_deferred_out

    def get_idx(self, req_id: int) -> int | None:
        return self.req_ids.index(req_id) if req_id in self.req_ids else None


class Scheduler:
    batch = ScheduledBatch

    def __init__(self, config: Any) -> None:
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.eos = config.eos
        self.block_manager = BlockManager(config.num_kvcache_blocks, config.kvcache_block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def _batch(
        self, seq: Sequence, n: int, prefill: bool
    ) -> tuple[ScheduledBatch, dict[int, Sequence]]:
        seq.type = SequenceType.PREFILL if prefill else SequenceType.DECODE
        seqs = {seq.id: seq}
        return self.batch(seqs, [n], prefill), seqs

    def schedule(self) -> tuple[ScheduledBatch, dict[int, Sequence]] | None:
        budget = self.max_num_batched_tokens
        for seq in self.running:  # resume a partial prefill first
            if seq.is_partial_prefill:
                return self._batch(seq, min(seq.num_tokens - seq.num_cached_tokens, budget), True)
        if self.waiting:
            seq = self.waiting[0]
            hits = self.block_manager.can_allocate(seq)
            if hits == -1:
                return None
            self.block_manager.allocate(seq, hits)
            seq.status = SequenceStatus.RUNNING
            self.running.append(self.waiting.popleft())
            return self._batch(seq, min(seq.num_tokens - seq.num_cached_tokens, budget), True)
        if not self.running:
            return None
        seq = self.running[0]
        if not self.block_manager.can_append(seq):
            raise RuntimeError("no block to append to (the stand-in does not preempt)")
        self.block_manager.may_append(seq)
        return self._batch(seq, 1, False)

    def postprocess(
        self,
        seqs: list[Sequence],
        fwd_output: ScheduledBatchOutput,
        stream_output_queue: Any = None,
        batch: ScheduledBatch | None = None,
    ) -> list[Sequence]:
        was_partial: set[int] = set()
        by_id = {seq.id: seq for seq in self.running}
        for i, req_id in enumerate(batch.req_ids if batch is not None else ()):
            seq = by_id[req_id]
            if seq.type != SequenceType.PREFILL:
                continue
            if seq.is_partial_prefill:
                was_partial.add(seq.id)
            seq.num_scheduled_tokens = int(batch.num_scheduled_tokens[i])  # type: ignore[union-attr]
            self.block_manager.hash_blocks(seq)
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            seq.is_partial_prefill = seq.num_cached_tokens < seq.num_prompt_tokens
        finished = []
        for seq in self.running:
            idx = fwd_output.get_idx(seq.id)
            if idx is None or seq.is_partial_prefill or self.stale(seq, was_partial):
                continue
            token = int(fwd_output.token_ids[idx][0])
            if fwd_output.is_deferred_out:  # the token fills the placeholder of its step
                seq.token_ids[-1] = seq.last_token = token
            else:
                seq.append_token(token)
            if seq.num_completion_tokens >= seq.max_tokens:
                finished.append(seq)
        for seq in seqs:
            running = seq.status == SequenceStatus.RUNNING and seq not in finished
            if fwd_output.is_deferred_out and running and not seq.is_partial_prefill:
                seq.append_token(self.eos)  # the placeholder of the step just run
        for seq in finished:
            seq.status = SequenceStatus.FINISHED
            self.block_manager.deallocate(seq)
            self.running.remove(seq)
        return finished

    def stale(self, seq: Sequence, was_partial: set[int]) -> bool:
        """A deferred output seen at the chunk that ends a partial prefill is the token of
        the chunk before it (sampled mid-prompt): dropped."""
        return seq.id in was_partial


class FinalChunkBatch(ScheduledBatch):
    """ATOM main's batch: ``produces_output()`` is False for prefill chunks that do not end a
    prompt, and its runner answers those with no tokens and no deferred step."""

    def __init__(self, seqs: dict[int, Sequence], counts: list[int], prefill: bool) -> None:
        super().__init__(seqs, counts, prefill)
        self.is_final_chunk = [
            not prefill or seq.num_cached_tokens + n >= seq.num_prompt_tokens
            for seq, n in zip(seqs.values(), counts)
        ]

    def produces_output(self) -> bool:
        return any(self.is_final_chunk)


class FinalChunkScheduler(Scheduler):
    batch = FinalChunkBatch


# -- planted bugs (negative controls) ----------------------------------------------------------
class FirstChunkImages(ScheduledBatch):
    """The batch moves a sequence's images into itself and clears them on the sequence (as
    ATOM's does): a prompt prefilled in chunks gets its image rows in the first chunk only,
    and an image in a later chunk is computed from its placeholder tokens."""

    def take_images(self, seqs: dict[int, Sequence], prefill: bool) -> dict[int, Any]:
        taken = super().take_images(seqs, prefill)
        for seq in seqs.values():
            seq.multimodal_data = None
        return taken


class ImagesMovedScheduler(Scheduler):
    batch = FirstChunkImages


class StaleTokenScheduler(Scheduler):
    """Post-processing keeps the deferred token a chunked prefill's last chunk sees (sampled
    mid-prompt by the chunk before it) as the first generated token, without its KV."""

    def stale(self, seq: Sequence, was_partial: set[int]) -> bool:
        if seq.id in was_partial:
            seq.append_token(0)  # appended after the prompt: the slot of a token never run
            return True
        return False
