"""The call order of a paged engine's scheduler, on one sequence at a time.

Two ways to drive a block manager:

- with the engine's own **scheduler** (``Scheduler(config)``: ``add`` -> ``schedule()`` ->
  the model's step on what it scheduled -> ``postprocess``), its block manager replaced by the
  one under test. ``schedule()`` returns either nano-vllm's ``(sequences, is_prefill)``, or a
  batch object and its sequences (ATOM's ``(ScheduledBatch, {id: seq})``, or None), which
  ``batches.py`` runs as ATOM's engine core does: read from the batch what ATOM's model runner
  reads, answer with its ``ScheduledBatchOutput``, ``postprocess(seqs, output, batch=batch)``;
- without one (a block manager alone):
  ``can_allocate`` -> ``allocate`` -> prefill -> ``hash_blocks`` -> then per generated token
  ``can_append`` -> ``may_append`` -> decode step -> ``hash_blocks`` -> ``deallocate``.

Both generations of nano-vllm's interface are accepted: the classic one (``can_allocate(seq)
-> bool``, ``allocate(seq)`` hashes full blocks, ``may_append`` hashes a filled block,
``postprocess(seqs, token_ids)``) and the current one (``can_allocate(seq) -> int`` cached
blocks or -1, ``allocate(seq, num_cached_blocks)``, ``hash_blocks(seq)`` after the forward,
chunked prefill through ``num_scheduled_tokens``, ``postprocess(seqs, token_ids,
is_prefill)``); ATOM's ``hash_blocks(seq, num_new_tokens)`` too. Which one is read from the
signatures, never guessed from names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from pytest_prefixcache.errors import EngineError

from .batches import BatchRunner

__all__ = ["Sampling", "Step", "drive", "scheduler_config"]


@dataclass
class Sampling:
    """Sampling parameters with every field nano-vllm and its forks read; the harness samples
    greedily itself (temperature is never used) and ends a sequence at any EOS id by setting
    its ``max_tokens`` (``ignore_eos`` is on, so the scheduler's single EOS id does not)."""

    max_tokens: int = 16
    temperature: float = 1.0
    ignore_eos: bool = True
    cfg_scale: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    logits_processor: Any = None
    logits_processor_update_state: Any = None


#: The model's step: (sequence, first position, end position, is_prefill) -> the greedy
#: token after ``end`` (None when [first, end) is a prefill chunk that does not end the prompt);
#: a batch scheduler's step also passes ``table=``, ``tokens=`` and ``images=`` (batches.py).
Step = Callable[..., "int | None"]


def scheduler_config(num_blocks: int, block_size: int, batched_tokens: int) -> SimpleNamespace:
    """The attributes nano-vllm's ``Scheduler(config)`` reads (one sequence at a time;
    ``batched_tokens`` per step: a prompt longer than that is prefilled in chunks by a
    scheduler that chunks, as nano-vllm's current one does)."""
    return SimpleNamespace(
        max_num_seqs=1,
        max_num_batched_tokens=batched_tokens,
        eos=-1,
        kvcache_block_size=block_size,
        num_kvcache_blocks=num_blocks,
        max_model_len=1 << 16,
    )


def _positional(fn: Callable[..., Any]) -> int:
    """How many positional parameters ``fn`` takes (bound methods: without self)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _finished(seq: Any) -> bool:
    done = getattr(seq, "is_finished", None)
    if isinstance(done, bool):
        return done
    return str(getattr(getattr(seq, "status", None), "name", "")) == "FINISHED"


def _publish(bm: Any, seq: Any, n: int) -> None:
    """Tell the block manager that the ``n`` positions from ``seq.num_cached_tokens`` now hold
    computed KV (its ``hash_blocks``, when it has one), then advance ``num_cached_tokens``."""
    hash_blocks = getattr(bm, "hash_blocks", None)
    if hash_blocks is not None:
        seq.num_scheduled_tokens = n
        if _positional(hash_blocks) >= 2:
            hash_blocks(seq, n)
        else:
            hash_blocks(seq)
        seq.num_scheduled_tokens = 0
    seq.num_cached_tokens += n


def drive(
    seq: Any,
    step: Step,
    *,
    block_manager: Any,
    scheduler: Any | None,
    prompt_len: int,
    eos: frozenset[int],
    runner: BatchRunner | None = None,
) -> int:
    """Serve ``seq`` to the end through ``scheduler`` (or ``block_manager`` alone); return the
    prompt tokens the block manager reported as cached when it allocated the sequence.
    ``runner`` runs the batches of a scheduler that returns batch objects (a new one when
    not given: no previous forward)."""
    if scheduler is not None:
        return _with_scheduler(seq, step, scheduler, prompt_len, eos, runner or BatchRunner())
    return _alone(seq, step, block_manager, prompt_len, eos)


def _stop_at(seq: Any, token: int, at: int, eos: frozenset[int]) -> None:
    """Make the scheduler finish ``seq`` at the token of position ``at`` when it is an EOS id."""
    if token in eos:
        seq.max_tokens = min(seq.max_tokens, at - seq.num_prompt_tokens + 1)


def _with_scheduler(
    seq: Any,
    step: Step,
    scheduler: Any,
    prompt_len: int,
    eos: frozenset[int],
    runner: BatchRunner,
) -> int:
    scheduler.add(seq)
    cached: int | None = None
    postprocess = scheduler.postprocess
    with_flag = _positional(postprocess) >= 3
    for _ in range(prompt_len + seq.max_tokens + 8):
        result = scheduler.schedule()
        if result is not None and not isinstance(result[0], (list, tuple)):
            start = runner.run(
                result, seq, step, scheduler=scheduler, stop=lambda t, at: _stop_at(seq, t, at, eos)
            )
            if cached is None and start is not None:
                cached = start
            if _finished(seq):
                if cached is None:
                    raise EngineError(
                        f"the scheduler finished a prompt of {prompt_len} tokens without "
                        f"running it ({getattr(seq, 'leave_reason', '') or 'no reason given'})"
                    )
                return cached
            continue
        seqs, is_prefill = result if result is not None else ([], False)
        if not seqs:
            reason = getattr(seq, "leave_reason", "") or "no room in the block manager?"
            raise EngineError(
                f"the scheduler scheduled nothing for a prompt of {prompt_len} tokens with "
                f"nothing else running ({reason})"
            )
        if list(seqs) != [seq]:
            raise EngineError(f"the scheduler scheduled {len(seqs)} sequences, not the one added")
        if is_prefill:
            start = seq.num_cached_tokens
            if cached is None:
                cached = start
            n = getattr(seq, "num_scheduled_tokens", 0) or len(seq) - start
            token = step(seq, start, start + n, True)
        else:
            token = step(seq, len(seq) - 1, len(seq), False)
        if token is not None:
            _stop_at(seq, token, len(seq), eos)
        args = (seqs, [0 if token is None else token])
        postprocess(*args, is_prefill) if with_flag else postprocess(*args)
        if _finished(seq):
            return cached or 0
    reason = getattr(seq, "leave_reason", "")
    raise EngineError(
        f"the scheduler did not finish a sequence of {prompt_len} prompt tokens"
        + (f" ({reason})" if reason else "")
    )


def _alone(seq: Any, step: Step, bm: Any, prompt_len: int, eos: frozenset[int]) -> int:
    answer = bm.can_allocate(seq)
    if answer is False or (not isinstance(answer, bool) and answer < 0):
        raise EngineError(
            f"the block manager has no room for a prompt of {prompt_len} tokens "
            f"(can_allocate returned {answer!r} with nothing else running)"
        )
    if _positional(bm.allocate) >= 2 and not isinstance(answer, bool):
        bm.allocate(seq, answer)
    else:
        bm.allocate(seq)
    cached = int(seq.num_cached_tokens)
    try:
        token = step(seq, cached, prompt_len, True)
        assert token is not None
        _publish(bm, seq, prompt_len - cached)
        while True:
            _stop_at(seq, token, len(seq), eos)
            seq.append_token(token)
            if token in eos or len(seq) - prompt_len >= seq.max_tokens:
                break
            can_append = getattr(bm, "can_append", None)
            if can_append is not None and not can_append(seq):
                raise EngineError(f"the block manager has no room to append to {len(seq)} tokens")
            bm.may_append(seq)
            token = step(seq, len(seq) - 1, len(seq), False)
            assert token is not None
            _publish(bm, seq, 1)
    finally:
        bm.deallocate(seq)
    return cached
