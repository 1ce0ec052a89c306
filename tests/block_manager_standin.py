"""A stand-in for nano-vllm's block manager, sequence and scheduler, written here from their
interface (nano-vllm-fork on the package index needs torch to import, too big for CI): the
same classes, methods, attributes and call order, so the harness drives it exactly as it
drives the real one (engines/nano-vllm/run.sh). Chained block hashes over token ids, a
content check on every hit, reference counts, a FIFO free list whose freed blocks stay
indexed until reused.

The planted bugs (negative controls) are subclasses that break one rule each; every one
makes the model read KV it must not, and the suite must fail and shrink on it.
"""

from __future__ import annotations

import hashlib
from collections import deque
from enum import Enum, auto
from itertools import count
from typing import Any

import numpy as np


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    block_size = 256
    counter = count()

    def __init__(self, token_ids: list[int], sampling_params: Any) -> None:
        self.seq_id = next(Sequence.counter)
        self.status = SequenceStatus.WAITING
        self.token_ids = list(token_ids)
        self.last_token = self.token_ids[-1]
        self.num_tokens = len(self.token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.num_cached_tokens = 0
        self.num_scheduled_tokens = 0
        self.block_table: list[int] = []
        self.max_tokens = sampling_params.max_tokens
        self.ignore_eos = sampling_params.ignore_eos

    def __len__(self) -> int:
        return self.num_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def num_completion_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def num_blocks(self) -> int:
        return -(-self.num_tokens // self.block_size)

    def block(self, i: int) -> list[int]:
        return self.token_ids[i * self.block_size : (i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.last_token = token_id
        self.num_tokens += 1


class Block:
    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: list[int] = []


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()

    @classmethod
    def compute_hash(cls, token_ids: list[int], prefix: int = -1) -> int:
        h = hashlib.blake2b(digest_size=8)
        if prefix != -1:
            h.update(prefix.to_bytes(8, "little"))
        h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
        return int.from_bytes(h.digest(), "little")

    def _take(self) -> int:
        block_id = self.free_block_ids.popleft()
        block = self.blocks[block_id]
        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]  # its content is about to be overwritten
        block.ref_count, block.hash, block.token_ids = 1, -1, []
        self.used_block_ids.add(block_id)
        return block_id

    def _hit(self, h: int, token_ids: list[int]) -> int:
        block_id = self.hash_to_block_id.get(h, -1)
        if block_id != -1 and self.blocks[block_id].token_ids != token_ids:
            return -1
        return block_id

    def can_allocate(self, seq: Sequence) -> int:
        h, hits, needed = -1, 0, seq.num_blocks
        for i in range(seq.num_blocks - 1):  # the last block is always computed
            h = self.compute_hash(seq.block(i), h)
            block_id = self._hit(h, seq.block(i))
            if block_id == -1:
                break
            hits += 1
            needed -= block_id in self.used_block_ids
        return hits if len(self.free_block_ids) >= needed else -1

    def allocate(self, seq: Sequence, num_cached_blocks: int) -> None:
        assert not seq.block_table
        h = -1
        for i in range(num_cached_blocks):
            h = self.compute_hash(seq.block(i), h)
            block_id = self.hash_to_block_id[h]
            self._claim(block_id)
            seq.block_table.append(block_id)
        for _ in range(num_cached_blocks, seq.num_blocks):
            seq.block_table.append(self._take())
        seq.num_cached_tokens = num_cached_blocks * self.block_size

    def _claim(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block_id in self.used_block_ids:
            block.ref_count += 1
        else:
            block.ref_count = 1
            self.free_block_ids.remove(block_id)
            self.used_block_ids.add(block_id)

    def deallocate(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.used_block_ids.remove(block_id)
                self.free_block_ids.append(block_id)
        seq.num_cached_tokens = 0
        seq.block_table.clear()

    def can_append(self, seq: Sequence) -> bool:
        return len(self.free_block_ids) >= (len(seq) % self.block_size == 1)

    def may_append(self, seq: Sequence) -> None:
        if len(seq) % self.block_size == 1:
            seq.block_table.append(self._take())

    def hash_blocks(self, seq: Sequence) -> None:
        start = seq.num_cached_tokens // self.block_size
        end = (seq.num_cached_tokens + seq.num_scheduled_tokens) // self.block_size
        h = self.blocks[seq.block_table[start - 1]].hash if start > 0 else -1
        for i in range(start, end):
            h = self.compute_hash(seq.block(i), h)
            block = self.blocks[seq.block_table[i]]
            block.hash, block.token_ids = h, seq.block(i)
            self.hash_to_block_id[h] = block.block_id


class Scheduler:
    def __init__(self, config: Any) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.eos = config.eos
        self.block_size = config.kvcache_block_size
        self.block_manager = BlockManager(config.num_kvcache_blocks, config.kvcache_block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> tuple[list[Sequence], bool]:
        scheduled: list[Sequence] = []
        budget = self.max_num_batched_tokens
        while self.waiting and len(scheduled) < self.max_num_seqs and budget:
            seq = self.waiting[0]
            if not seq.block_table:
                hits = self.block_manager.can_allocate(seq)
                if hits == -1:
                    break
                self.block_manager.allocate(seq, hits)
            todo = seq.num_tokens - seq.num_cached_tokens
            seq.num_scheduled_tokens = min(todo, budget)
            budget -= seq.num_scheduled_tokens
            if seq.num_cached_tokens + seq.num_scheduled_tokens == seq.num_tokens:
                seq.status = SequenceStatus.RUNNING
                self.running.append(self.waiting.popleft())
            scheduled.append(seq)
        if scheduled:
            return scheduled, True
        while self.running and len(scheduled) < self.max_num_seqs:
            seq = self.running.popleft()
            if not self.block_manager.can_append(seq):
                raise RuntimeError("no block to append to (the stand-in does not preempt)")
            seq.num_scheduled_tokens = 1
            self.block_manager.may_append(seq)
            scheduled.append(seq)
        self.running.extendleft(reversed(scheduled))
        return scheduled, False

    def postprocess(self, seqs: list[Sequence], token_ids: list[int], is_prefill: bool) -> None:
        for seq, token_id in zip(seqs, token_ids):
            self.block_manager.hash_blocks(seq)
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            if is_prefill and seq.num_cached_tokens < seq.num_tokens:
                continue
            seq.append_token(token_id)
            eos = not seq.ignore_eos and token_id == self.eos
            if eos or seq.num_completion_tokens == seq.max_tokens:
                seq.status = SequenceStatus.FINISHED
                self.block_manager.deallocate(seq)
                self.running.remove(seq)


# -- planted bugs (negative controls) ----------------------------------------------------------
class UnchainedHash(BlockManager):
    """A block's hash ignores its parent: a block of the same tokens after another prefix hits,
    and its KV (computed after that other prefix, at other positions) is read."""

    @classmethod
    def compute_hash(cls, token_ids: list[int], prefix: int = -1) -> int:
        return super().compute_hash(token_ids)


class StaleHit(BlockManager):
    """A freed block stays indexed after it is handed out again, and a hit is not checked
    against the block's content: a later prompt reads the KV that overwrote it."""

    def _take(self) -> int:
        block_id = self.free_block_ids.popleft()
        block = self.blocks[block_id]
        block.ref_count = 1  # the index entry and token_ids are kept
        self.used_block_ids.add(block_id)
        return block_id

    def _hit(self, h: int, token_ids: list[int]) -> int:
        return self.hash_to_block_id.get(h, -1)


class FullPromptHit(BlockManager):
    """The last block counts as a hit too when the whole prompt is cached in full blocks: the
    reported reuse covers every prompt token, and the last position's logits are never
    computed from this prompt (the harness must refuse, not invent them)."""

    def can_allocate(self, seq: Sequence) -> int:
        hits = super().can_allocate(seq)
        if hits == seq.num_blocks - 1 and seq.num_tokens % self.block_size == 0:
            h = -1
            for i in range(seq.num_blocks):
                h = self.compute_hash(seq.block(i), h)
            if self._hit(h, seq.block(seq.num_blocks - 1)) != -1:
                return hits + 1
        return hits


class AppendReusesLastBlock(BlockManager):
    """Decoding into a new block appends the sequence's last block id again: the new
    positions overwrite the rows of the previous block, which later steps read."""

    def may_append(self, seq: Sequence) -> None:
        if len(seq) % self.block_size == 1:
            seq.block_table.append(seq.block_table[-1])
            self.blocks[seq.block_table[-1]].ref_count += 1


# -- the classic interface (nano-vllm-fork, early nano-vllm) ---------------------------------
class ClassicBlockManager(BlockManager):
    """``can_allocate(seq) -> bool``; ``allocate(seq)`` finds the hits and hashes every full
    block at once (before the forward: one sequence at a time, nothing reads it earlier);
    ``may_append`` hashes a block once a token fills it. No ``hash_blocks``."""

    hash_blocks = None  # type: ignore[assignment]

    def can_allocate(self, seq: Sequence) -> bool:  # type: ignore[override]
        return len(self.free_block_ids) >= seq.num_blocks

    def allocate(self, seq: Sequence, num_cached_blocks: int = 0) -> None:
        assert not seq.block_table
        h, miss = -1, False
        for i in range(seq.num_blocks):
            tokens = seq.block(i)
            full = len(tokens) == self.block_size
            h = self.compute_hash(tokens, h) if full else -1
            block_id = -1 if miss or not full or i == seq.num_blocks - 1 else self._hit(h, tokens)
            miss = miss or block_id == -1
            if block_id == -1:
                block_id = self._take()
            else:
                self._claim(block_id)
                seq.num_cached_tokens += self.block_size
            if full:
                block = self.blocks[block_id]
                block.hash, block.token_ids = h, tokens
                self.hash_to_block_id[h] = block_id
            seq.block_table.append(block_id)

    def may_append(self, seq: Sequence) -> None:
        if len(seq) % self.block_size == 1:
            seq.block_table.append(self._take())
        elif len(seq) % self.block_size == 0:
            last = seq.num_blocks - 1
            parent = self.blocks[seq.block_table[last - 1]].hash if last else -1
            h = self.compute_hash(seq.block(last), parent)
            block = self.blocks[seq.block_table[-1]]
            block.hash, block.token_ids = h, seq.block(last)
            self.hash_to_block_id[h] = block.block_id


class ClassicScheduler(Scheduler):
    """Prefill whole prompts, ``postprocess(seqs, token_ids)`` without ``is_prefill``."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.block_manager = ClassicBlockManager(config.num_kvcache_blocks, self.block_size)

    def schedule(self) -> tuple[list[Sequence], bool]:
        if self.waiting:
            seq = self.waiting[0]
            if not self.block_manager.can_allocate(seq):
                return [], True
            self.block_manager.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(self.waiting.popleft())
            return [seq], True
        seq = self.running[0]
        self.block_manager.may_append(seq)
        return [seq], False

    def postprocess(self, seqs: list[Sequence], token_ids: list[int]) -> None:  # type: ignore[override]
        for seq, token_id in zip(seqs, token_ids):
            seq.append_token(token_id)
            if seq.num_completion_tokens == seq.max_tokens:
                seq.status = SequenceStatus.FINISHED
                self.block_manager.deallocate(seq)
                self.running.remove(seq)
