"""Shared test fixtures: MLX pinned to its CPU device, and the tiny Qwen2-VL loaded once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session", autouse=True)
def _mlx_on_cpu() -> Iterator[None]:
    """Every test runs MLX on its CPU device, where cached and cold runs are bit-identical, so
    the tests mean the same on a Mac (whose default device is the GPU)."""
    try:
        import mlx.core as mx
    except ImportError:  # the plugin's own tests run without MLX
        yield
        return
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(previous)


@pytest.fixture(scope="session")
def model() -> Any:
    """The tiny Qwen2-VL fixture, loaded once (a ``reference_engine.model.LoadedModel``)."""
    pytest.importorskip("mlx.core")
    from reference_engine import default_model_path
    from reference_engine.model import load_model

    return load_model(default_model_path())


@pytest.fixture(scope="session")
def models(model: Any) -> Any:
    """A loader of the shipped fixtures by folder name, each loaded once
    (``models("tiny-gemma3")``; ``models("tiny-qwen2-vl")`` is ``model``)."""
    from pytest_prefixcache.package_data import fixture_model
    from reference_engine.fixtures.qwen2_vl import QWEN2_VL_DIR
    from reference_engine.model import load_model

    loaded = {QWEN2_VL_DIR: model}

    def get(name: str) -> Any:
        if name not in loaded:
            loaded[name] = load_model(fixture_model(name))
        return loaded[name]

    return get
