"""The concurrency mutants (class 10) show their bug only among requests in flight.

Each test builds the race by hand (deterministic), shows the wrong answer, and shows that the
same requests one at a time, on the mutant, are answered right (so only the waves property
can catch it). The waves property catching them from generated waves is in
``tests/test_mutants_detection.py`` (marked ``timing``: a race shows when the threads let it);
these forced races are the fast lane's test of each concurrency mutant.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mlx.core")

from pytest_prefixcache import Message, Request
from reference_engine.engine import Engine
from reference_engine.mutants import MUTANTS

SYSTEM = "You are a careful assistant. Answer every question precisely and briefly. " * 3

LONG = "Explain in detail how a prefix cache keeps its blocks consistent. " * 3


def _req(text: str, new: int = 0) -> Request:
    return Request((Message("system", (SYSTEM,)), Message("user", (text,))), "", new)


def _same_as_cold(engine: Engine, request: Request) -> bool:
    warm = engine.run(request, use_cache=True)
    cold = engine.run(request, use_cache=False)
    assert warm.logits is not None and cold.logits is not None
    return bool(np.array_equal(warm.logits, cold.logits))


def _in_thread(fn: Any) -> Any:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(60)
    return out[0]


def test_one_at_a_time_the_concurrency_mutants_answer_right(model: Any) -> None:
    names = (
        "wrong_batch_row",
        "read_before_write",
        "evict_in_use",
        "ragged_batch",
        "ragged_decode",
    )
    for name in names:
        engine = MUTANTS[name].build(model)
        for text in ("First question. " + LONG, "Other question. " + LONG):
            assert _same_as_cold(engine, _req(text, 2)), name
        assert _same_as_cold(engine, _req("First question. " + LONG)), name


def test_wrong_batch_row_stores_the_other_rows_of_the_batch(model: Any) -> None:
    engine = MUTANTS["wrong_batch_row"].build(model)
    other = _req("Other question, a longer one. " + LONG + LONG)
    cache: list[Any] = []
    restore = engine.restore

    def keep(reuse: Any, capacity: int) -> list[Any]:
        cache.append(restore(reuse, capacity))
        return cache[-1]

    engine.restore = keep  # type: ignore[method-assign]
    _in_thread(lambda: engine.run(other, use_cache=False))
    engine.restore = restore  # type: ignore[method-assign]
    engine._live[-1] = cache[0]  # that request is still in flight: a row of the batch
    first = _req("First question. " + LONG)
    engine.run(first, use_cache=True)  # stored from the other row
    del engine._live[-1]
    assert not _same_as_cold(engine, first)


def test_read_before_write_reuses_blocks_nobody_wrote(model: Any) -> None:
    engine = MUTANTS["read_before_write"].build(model)
    engine.in_flight_wait = 0.1  # a's prefill never comes: nobody waits for it long
    engine.run(_req("Warm-up. " + LONG), use_cache=True)  # the mutant learns the layout
    a = _req("First question. " + LONG)
    rendered = engine.render(a, {})
    keys = engine.keys(rendered, a)
    # request a is admitted (its blocks published) and has not prefilled yet
    served, reuse, writing = _in_thread(lambda: engine.admit(keys, rendered, a, use_cache=True))
    assert served is not None
    b = _req("First question. " + LONG + "And one more thing.")
    warm = engine.run(b, use_cache=True)
    cold = engine.run(b, use_cache=False)
    assert warm.cached_tokens and not np.array_equal(warm.logits, cold.logits)
    engine.pool.release(reuse.held)
    engine.inflight.done(writing)


def _held_rows_after_pressure(engine: Engine) -> tuple[list[Any], list[Any]]:
    """Where the rows of the blocks a request in flight holds (admitted, not restored yet)
    are, before and after other requests fill the small pool."""
    a = _req("First question. " + LONG)
    engine.run(a, use_cache=True)
    rendered = engine.render(a, {})
    keys = engine.keys(rendered, a)
    held = _in_thread(lambda: engine.lookup(keys, len(rendered.token_ids)))
    assert held.blocks
    before = [(b.payload.segment, b.payload.offset) for b in held.blocks]
    for i in range(12):
        engine.run(_req(f"Question number {i}. " + LONG + LONG), use_cache=True)
    after = [(b.payload.segment, b.payload.offset) for b in held.blocks]
    engine.pool.release(held.blocks)
    return before, after


def test_evict_in_use_evicts_what_another_request_holds(model: Any) -> None:
    before, after = _held_rows_after_pressure(MUTANTS["evict_in_use"].build(model))
    assert before != after  # the held blocks' memory now holds other rows
    options = MUTANTS["evict_in_use"].options
    before, after = _held_rows_after_pressure(Engine(model, **options))
    assert before == after  # the reference never evicts a block in use


def test_ragged_batch_attends_the_padding_of_a_shorter_cached_prefix(model: Any) -> None:
    engine = MUTANTS["ragged_batch"].build(model)
    first = _req("First question. " + LONG, 2)
    engine.run(first, use_cache=True)  # stores the system prompt's blocks, and more
    again = _req("Second question. " + LONG, 2)
    assert _same_as_cold(engine, again)  # alone: no padding
    engine._prefixes[-1] = 10_000  # a request in flight resumes from a longer prefix
    try:
        # the cold run in that batch has no cached prefix: no padding, right
        cold = engine.run(first, use_cache=False)
        reference = Engine(model).run(first, use_cache=False)
        assert np.array_equal(cold.logits, reference.logits)
        third = _req("Third question. " + LONG, 2)
        warm = engine.run(third, use_cache=True)
        assert warm.cached_tokens  # resumed from the system prompt, batched left-padded
        assert not np.array_equal(warm.logits, Engine(model).run(third, use_cache=False).logits)
    finally:
        del engine._prefixes[-1]
    # the rows it stored were computed attending the padding: a later hit reads them
    assert not _same_as_cold(engine, third)


def test_ragged_decode_misplaces_a_shorter_rows_steps_after_the_first_token(model: Any) -> None:
    engine = MUTANTS["ragged_decode"].build(model)
    request = _req("First question. " + LONG, 4)
    right = Engine(model).run(request, use_cache=False)
    assert len(right.step_logits) == 4
    for use_cache in (False, True):  # a batching fault: the cold run in a batch too
        engine._decoding[-1] = right.prompt_tokens + 50  # a longer row decoding meanwhile
        try:
            wrong = engine.run(request, use_cache=use_cache)
        finally:
            del engine._decoding[-1]
        assert np.array_equal(wrong.step_logits[0], right.step_logits[0])  # the first token
        for a, b in zip(wrong.step_logits[1:], right.step_logits[1:]):
            assert not np.array_equal(a, b)  # every decode step after it
    engine._decoding[-1] = 1  # a shorter row decoding meanwhile: this one is the longest
    try:
        longest = engine.run(request, use_cache=False)
    finally:
        del engine._decoding[-1]
    assert all(np.array_equal(a, b) for a, b in zip(longest.step_logits, right.step_logits))
