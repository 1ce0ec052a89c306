"""The reference engine's gated-delta kernel per prefill piece (``reference_engine.recurrent``).

Inside :func:`sequential_pieces` a short piece runs the sequential recurrence; everywhere else
(another engine in the same process, another thread) mlx-vlm's ``gated_delta_chunked`` answers
bit for bit as it would without the dispatcher; inside it a longer piece runs the engine's own
scan (``recurrent.scan``: one LAPACK triangular inverse per chunk instead of forward
substitution; one chunk up to ``ONE_CHUNK_UP_TO`` positions, chunks of ``PIECE_CHUNK`` above).
The kernels round differently (the negative control: a cold and a warm run that chose
differently for one piece would not be bit-exact), and the engine's cold and warm runs choose
alike, so they stay bit-identical.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
gd = pytest.importorskip("mlx_vlm.models.qwen3_5.gated_delta")

from test_engine import SYSTEM, assistant, req, user  # noqa: E402

from pytest_prefixcache.package_data import fixture_model  # noqa: E402
from reference_engine import Engine  # noqa: E402
from reference_engine.model import load_model  # noqa: E402
from reference_engine.recurrent import (  # noqa: E402
    ONE_CHUNK_UP_TO,
    PIECE_CHUNK,
    SEQUENTIAL_UP_TO,
    install,
    original_chunked,
    scan,
    sequential_pieces,
)


def piece(n: int, seed: int = 0) -> tuple[Any, ...]:
    """Inputs of one gated-delta call on tiny-qwen3.5-vl's shapes (2 key heads, 4 value heads,
    dimensions 16), ``n`` positions; queries and keys L2-normalised, as the model's are."""
    mx.random.seed(seed)
    q, k = (mx.random.normal((1, n, 2, 16)) for _ in range(2))
    q, k = (x / mx.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    v = mx.random.normal((1, n, 4, 16))
    g = mx.random.uniform(0.5, 1.0, (1, n, 4))
    beta = mx.random.uniform(0.0, 1.0, (1, n, 4))
    return q, k, v, g, beta, mx.zeros((1, 4, 16, 16), dtype=mx.float32)


def outputs(result: tuple[Any, Any]) -> list[np.ndarray]:
    return [np.array(a) for a in result]


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def test_outside_the_engine_the_dispatcher_is_mlx_vlms_own_kernel() -> None:
    assert install() and install()  # idempotent
    args = piece(8)
    own = outputs(original_chunked()(*args))
    assert same(outputs(gd.gated_delta_chunked(*args)), own)
    with sequential_pieces(0, 0):
        assert same(outputs(gd.gated_delta_chunked(*args)), own)


def test_inside_a_short_piece_runs_sequentially_and_a_long_one_through_the_scan() -> None:
    install()
    short, medium = piece(SEQUENTIAL_UP_TO), piece(ONE_CHUNK_UP_TO - 3, seed=2)
    long = piece(5 * PIECE_CHUNK + 3, seed=1)
    sequential = outputs(gd.gated_delta_ops(*short))
    chunked = outputs(original_chunked()(*short))
    one_chunk, in_chunks = outputs(scan(*medium)), outputs(scan(*long))
    # the negative controls: the kernels round differently (the sequential recurrence, a scan in
    # chunks of 8 as the engine had, one chunk or chunks of PIECE_CHUNK), so a cold and a warm
    # run must choose alike for every piece to stay bit-exact
    assert not same(sequential, chunked)
    for x, ours in ((medium, one_chunk), (long, in_chunks)):
        assert not same(ours, outputs(original_chunked()(*x, None, 8)))
        assert not same(ours, outputs(gd.gated_delta_ops(*x)))
        # ... and they compute the same recurrence
        assert all(np.allclose(a, b, atol=1e-4) for a, b in zip(ours, gd.gated_delta_ops(*x)))
    assert not same(in_chunks, outputs(scan(*long, chunk=len(long[0][0]))))  # one chunk differs
    assert not same(in_chunks, outputs(original_chunked()(*long)))  # mlx-vlm's chunks of 64
    # the triangular inverse in one operation rounds as mlx-vlm's forward substitution does
    assert same(in_chunks, outputs(original_chunked()(*long, None, PIECE_CHUNK)))
    with sequential_pieces():
        assert same(outputs(gd.gated_delta_chunked(*short)), sequential)
        assert same(outputs(gd.gated_delta_chunked(*medium)), one_chunk)
        assert same(outputs(gd.gated_delta_chunked(*long)), in_chunks)
    with sequential_pieces(0, 0):  # mlx-vlm's own choice
        assert same(outputs(gd.gated_delta_chunked(*long)), outputs(original_chunked()(*long)))
    with pytest.raises(ValueError, match="limit and chunk must be at least 0, got -1 and 8"):
        with sequential_pieces(-1, 8):
            pass


def test_the_choice_belongs_to_the_thread_that_made_it() -> None:
    install()
    args = piece(8)
    own = outputs(original_chunked()(*args))
    seen: list[list[np.ndarray]] = []
    inside, done = threading.Event(), threading.Event()

    def engine_thread() -> None:
        with sequential_pieces():
            inside.set()
            done.wait(10)

    t = threading.Thread(target=engine_thread)
    t.start()
    assert inside.wait(10)
    seen.append(outputs(gd.gated_delta_chunked(*args)))  # a peer's call meanwhile
    done.set()
    t.join()
    assert same(seen[0], own)


@pytest.mark.slow
def test_cold_and_warm_choose_alike_and_a_mismatch_is_seen() -> None:
    """The engine's warm run (resumed at a snapshot) is bit-identical to its cold run with the
    dispatcher on; the negative control: a cold run on mlx-vlm's own kernel choice differs."""
    model = load_model(fixture_model("tiny-qwen3.5-vl"))
    engine = Engine(model)
    first = req(SYSTEM, user("Describe the weather today, in a few words."))
    turn = req(
        SYSTEM,
        user("Describe the weather today, in a few words."),
        assistant("Grey and windy, with rain later."),
        user("And tomorrow?"),
    )
    engine.run(first, use_cache=True)
    warm = engine.run(turn, use_cache=True)
    assert warm.cached_tokens and warm.cached_tokens > 0
    cold = engine.run(turn, use_cache=False)
    assert warm.step_logits is not None and cold.step_logits is not None
    assert all(np.array_equal(a, b) for a, b in zip(warm.step_logits, cold.step_logits))
    model.piece_kernels = False
    other = engine.run(turn, use_cache=False)
    model.piece_kernels = True
    assert other.step_logits is not None
    assert not all(np.array_equal(a, b) for a, b in zip(other.step_logits, cold.step_logits))
