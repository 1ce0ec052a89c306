"""The hybrid family's recurrent decoder layers, compiled inside the engine's forward only
(``reference_engine.compiled_layers``).

Inside :func:`compiled_layers` a GatedDeltaNet decoder layer of the engine's model runs as one
compiled call and answers bit for bit as mlx-vlm's own call does (measured on this CPU for every
piece length the engine sends, on a fresh state and on a carried one); outside it, and on any
other model in the process, mlx-vlm's call runs untouched. A trace is kept per kernel choice and
adapter: the negative control shows a trace kept across a kernel change would answer with the
old kernel. The engine's cold and warm runs take it alike and stay bit-exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
language = pytest.importorskip("mlx_vlm.models.qwen3_5.language")

from test_engine import SYSTEM, assistant, req, user  # noqa: E402

from pytest_prefixcache.package_data import fixture_model  # noqa: E402
from reference_engine import Engine  # noqa: E402
from reference_engine.compiled_layers import ADAPTER, clear, compiled_layers  # noqa: E402
from reference_engine.model import LoadedModel, load_model  # noqa: E402
from reference_engine.recurrent import sequential_pieces  # noqa: E402

TRACES = "prefixcache_traces"


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model(fixture_model("tiny-qwen3.5-vl"))


def layers(model: LoadedModel) -> list[Any]:
    return list(model.model.language_model.model.layers)


def call(model: LoadedModel, x: Any, state: tuple[Any, Any] | None) -> list[np.ndarray]:
    """Layer 0 on ``x`` from ``state`` (None: a fresh cache): its output and the two states."""
    cache = model.make_cache()[0]
    if state is not None:
        cache.cache = list(state)
    h = layers(model)[0](x, mask=None, cache=cache)
    return [np.array(a) for a in (h, *cache.cache)]


def inputs(n: int, seed: int) -> tuple[Any, tuple[Any, Any]]:
    mx.random.seed(seed)
    x = mx.random.normal((1, n, 64))
    conv = 0.1 * mx.random.normal((1, 3, 128))
    state = 0.1 * mx.random.normal((1, 4, 16, 16))
    return x, (conv, state)


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_only_the_engines_model_has_them_and_only_inside_the_block(model: LoadedModel) -> None:
    assert model.compile_layers
    kinds = [type(layer) for layer in layers(model)]
    linear = [layer for layer in layers(model) if layer.is_linear]
    assert len(linear) == 6 and all(TRACES in layer.__dict__ for layer in linear)
    assert kinds[0].__module__ == "reference_engine.compiled_layers"
    assert kinds[3].__module__ != "reference_engine.compiled_layers"  # attention: untouched
    # another engine's model in the process is built from mlx-vlm's class, left as it was
    assert kinds[0].__mro__[1] is language.Qwen3_5DecoderLayer
    assert language.Qwen3_5DecoderLayer.__call__.__module__ == language.__name__
    clear(model.model.language_model)
    x, state = inputs(5, seed=0)
    with sequential_pieces():
        outside = call(model, x, state)
    assert not layers(model)[0].__dict__[TRACES]  # mlx-vlm's call ran
    with sequential_pieces(), compiled_layers():
        assert same(call(model, x, state), outside)
    assert layers(model)[0].__dict__[TRACES]


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13, 29])
def test_a_compiled_layer_answers_as_mlx_vlms_call(model: LoadedModel, n: int) -> None:
    x, state = inputs(n, seed=n)
    for start in (None, state):  # a fresh cache (a prompt's first piece) and a carried state
        with sequential_pieces():
            own = call(model, x, start)
            with compiled_layers():
                assert same(call(model, x, start), own)


def test_a_trace_is_kept_per_kernel_choice_and_adapter(model: LoadedModel) -> None:
    clear(model.model.language_model)
    x, state = inputs(29, seed=1)
    traces = layers(model)[0].__dict__[TRACES]
    with compiled_layers():
        with sequential_pieces():
            scan = call(model, x, state)
        with sequential_pieces(0, 0):  # mlx-vlm's own kernel: its chunks of 64
            own_kernel = call(model, x, state)
        token = ADAPTER.set("an-adapter@0")
        try:
            with sequential_pieces():
                adapted = call(model, x, state)
        finally:
            ADAPTER.reset(token)
    with sequential_pieces(0, 0):
        assert same(own_kernel, call(model, x, state))
    # the negative control: the two kernels round apart, so one trace for both would be wrong
    assert not same(own_kernel, scan)
    assert same(adapted, scan)  # no layer of this model carries that adapter
    assert len(traces) == 3


def test_a_cache_that_is_not_one_plain_sequence_runs_mlx_vlms_call(model: LoadedModel) -> None:
    clear(model.model.language_model)
    x, state = inputs(4, seed=2)
    layer = layers(model)[0]
    with sequential_pieces(), compiled_layers():
        cache = model.make_cache()[0]
        cache.cache = list(state)
        cache.lengths = mx.array([4])  # a batch's lengths: mlx-vlm masks by them
        layer(x, mask=None, cache=cache)
        layer(x, mask=mx.ones((1, 4), dtype=mx.bool_), cache=model.make_cache()[0])
    assert not layer.__dict__[TRACES]


def test_the_engines_cold_and_warm_runs_take_them_and_stay_exact(model: LoadedModel) -> None:
    clear(model.model.language_model)
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
    cold = engine.run(turn, use_cache=False)
    assert warm.cached_tokens and warm.cached_tokens > 0
    assert warm.step_logits is not None and cold.step_logits is not None
    assert all(np.array_equal(a, b) for a, b in zip(warm.step_logits, cold.step_logits))
    keys = layers(model)[0].__dict__[TRACES]
    assert {k[2] for k in keys} == {True, False}  # first pieces and carried states
    model.compile_layers = False
    try:
        plain = engine.run(turn, use_cache=False)
    finally:
        model.compile_layers = True
    assert plain.step_logits is not None  # mlx-vlm's calls, one operation at a time: the same
    assert all(np.array_equal(a, b) for a, b in zip(plain.step_logits, cold.step_logits))
