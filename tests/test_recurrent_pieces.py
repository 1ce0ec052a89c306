"""The reference engine's gated-delta kernel per prefill piece (``reference_engine.recurrent``).

Everywhere but inside :func:`sequential_pieces` (another engine in the same process, another
thread) mlx-vlm's ``gated_delta_chunked`` answers bit for bit as it would without the
dispatcher; inside it every piece of two or more positions runs the engine's own scan
(``recurrent.scan``: chunks of ``PIECE_CHUNK`` from the piece's start, one LAPACK triangular
inverse per chunk). A position's output does not depend on where its piece ends, so rows a
prompt stored stay exact for a later prompt whose piece over them ends elsewhere; the negative
control: a kernel chosen by the piece's length (the sequential recurrence for short pieces, as
the engine had) is not, and the saved stream that found it
(``hybrid_piece_end/``, from a default run on tiny-qwen3.5-vl) fails with such a choice.
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
from reference_engine import Engine, recurrent  # noqa: E402
from reference_engine.compiled_layers import clear  # noqa: E402
from reference_engine.model import load_model  # noqa: E402
from reference_engine.recurrent import (  # noqa: E402
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


def test_inside_every_piece_runs_the_scan_which_computes_the_recurrence() -> None:
    install()
    for n in (2, SEQUENTIAL_UP_TO + 1, PIECE_CHUNK, 3 * PIECE_CHUNK + 5):
        x = piece(n, seed=n)
        ours = outputs(scan(*x))
        with sequential_pieces():
            assert same(outputs(gd.gated_delta_chunked(*x)), ours)
        # the same recurrence, rounded its own way (not mlx-vlm's chunks of 64, nor sequential)
        assert all(np.allclose(a, b, atol=1e-4) for a, b in zip(ours, gd.gated_delta_ops(*x)))
        if n > 2:
            assert not same(ours, outputs(gd.gated_delta_ops(*x)))
    long = piece(3 * PIECE_CHUNK + 5, seed=1)
    assert not same(outputs(scan(*long)), outputs(original_chunked()(*long)))
    # one LAPACK inverse rounds as mlx-vlm's forward substitution with the same chunks
    assert same(outputs(scan(*long)), outputs(original_chunked()(*long, None, PIECE_CHUNK)))
    with sequential_pieces(0, 0):  # mlx-vlm's own choice
        assert same(outputs(gd.gated_delta_chunked(*long)), outputs(original_chunked()(*long)))
    with pytest.raises(ValueError, match="limit and chunk must be at least 0, got -1 and 8"):
        with sequential_pieces(-1, 8):
            pass


def ends_elsewhere(kernel: Any, longest: int = 40) -> int:
    """Pairs of pieces with the same first positions, the second longer, whose outputs over
    the shared positions differ under ``kernel``."""
    differ = 0
    for n in range(3, longest, 3):
        x = piece(n, seed=n)
        whole = np.array(kernel(*x)[0])
        for m in range(2, n):
            part = np.array(kernel(*(a[:, :m] for a in x[:5]), x[5])[0])
            differ += not np.array_equal(part, whole[:, :m])
    return differ


def by_length(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, mask: Any = None) -> Any:
    """The engine's old choice: sequential up to 6 positions, mlx-vlm's chunks of 8 above."""
    if q.shape[1] <= 6:
        return gd.gated_delta_ops(q, k, v, g, beta, state, mask)
    return original_chunked()(q, k, v, g, beta, state, mask, 8)


def test_a_positions_output_does_not_depend_on_where_its_piece_ends() -> None:
    assert ends_elsewhere(scan) == 0
    assert ends_elsewhere(by_length) > 0  # the negative control: a choice by length


@pytest.mark.slow
def test_the_saved_stream_is_exact_and_a_choice_by_length_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A default run found it: a block's rows computed in a piece ending at an image edge were
    reused by a prompt whose piece over them ended at a later image edge (1.43e-5)."""
    from pathlib import Path

    from pytest_prefixcache.output.streams import load_stream

    stream, _ = load_stream(Path(__file__).parent / "hybrid_piece_end" / "stream.json")
    model = load_model(fixture_model("tiny-qwen3.5-vl"))

    def worst() -> float:
        engine, out = Engine(model), 0.0
        for r in stream:
            warm, cold = engine.run(r, use_cache=True), engine.run(r, use_cache=False)
            pairs = zip(
                [warm.logits, *(warm.step_logits or ())], [cold.logits, *(cold.step_logits or ())]
            )
            out = max(
                out, *(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in pairs)
            )
        return out

    assert worst() == 0.0
    monkeypatch.setattr(recurrent, "scan", lambda *x, **_kw: by_length(*x[:7]))
    clear(model.model.language_model)  # the compiled layers traced the engine's scan
    assert worst() > 0.0


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
