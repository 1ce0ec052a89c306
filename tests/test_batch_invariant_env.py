"""``PREFIXCACHE_BATCH_INVARIANT``: a server declares the trait ``batch_invariant`` (a cold wave
that differs from the same requests alone is then a batching fault, tests/test_waves_ragged.py)
through every ``from_env`` (adapters/environment.py declares it once). Nothing is started: the
adapters are only built."""

from __future__ import annotations

import pytest

from pytest_prefixcache.adapters import omlx, seed
from pytest_prefixcache.adapters.presets import from_env
from pytest_prefixcache.errors import EngineError
from pytest_prefixcache.traits import traits_of


@pytest.fixture
def server_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("PREFIXCACHE_SERVER_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("PREFIXCACHE_COLD", "salt")
    monkeypatch.setenv("PREFIXCACHE_NAMESPACE_HEADER", "X-Tenant")
    monkeypatch.delenv("PREFIXCACHE_BATCH_INVARIANT", raising=False)
    return monkeypatch


def test_a_server_declares_batch_invariance_through_the_variable(
    server_env: pytest.MonkeyPatch,
) -> None:
    assert traits_of(from_env()).batch_invariant is False  # undeclared: the default
    server_env.setenv("PREFIXCACHE_BATCH_INVARIANT", "0")
    assert traits_of(from_env()).batch_invariant is False
    server_env.setenv("PREFIXCACHE_BATCH_INVARIANT", "1")
    assert traits_of(from_env()).batch_invariant is True


def test_a_bad_value_names_the_variable(server_env: pytest.MonkeyPatch) -> None:
    server_env.setenv("PREFIXCACHE_BATCH_INVARIANT", "yes")
    with pytest.raises(EngineError, match="PREFIXCACHE_BATCH_INVARIANT='yes' is not 0 or 1"):
        from_env()


@pytest.mark.parametrize("preset", [omlx, seed])
def test_the_engine_presets_read_it_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch, preset: object
) -> None:
    """oMLX's and the seed engines' ``from_env`` refuse a bad value before looking for their
    environments (an unset engine directory would fail later, differently)."""
    monkeypatch.setenv("PREFIXCACHE_BATCH_INVARIANT", "2")
    monkeypatch.setenv("SEED_ENGINE", "vllm-mlx")
    with pytest.raises(EngineError, match="PREFIXCACHE_BATCH_INVARIANT='2'"):
        preset.from_env()  # type: ignore[attr-defined]
