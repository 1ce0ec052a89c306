"""A cold wave served one request at a time is no batch: a cached wave that differs is then not
blamed on the cache (``wave_judge.UNSEPARATED``), it says the cold side could not tell.

Seen on rapid-mlx 0.16.10 ``--mllm`` (its cold server is reset before each uncached run): the
failure read "cache: only the cached wave differs" for a batched-decode fault (the shorter
row attends its left padding) with nothing reused. Negative control: the same wrong batch row
on an engine whose cold wave is sent together still reads as a cache fault."""

from __future__ import annotations

import pytest
from plugin_engines import FakeEngine

from pytest_prefixcache import EquivalenceFailure, Message, Request, Verifier
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.traits import traits_of
from pytest_prefixcache.types import Wave
from pytest_prefixcache.verify.wave_judge import CACHE_ONLY, UNSEPARATED

LONG = "the same long prompt shared by every request of the wave, " * 2
WAVES = (
    Wave(
        (
            Request((Message("user", (LONG + "first",)),), "", 0),
            Request((Message("user", (LONG + "second, a longer one to tell them apart",)),), "", 0),
        )
    ),
) * 2


class Invariant(FakeEngine):
    batch_invariant = True


class SerialCold(Invariant):
    """As an OpenAIEngine with ``cold="reset"``: its uncached runs go one at a time."""

    cold_waves_serial = "cold='reset' resets before each uncached run"


@pytest.mark.parametrize("engine", [SerialCold, Invariant])
def test_a_cached_wave_that_differs_blames_the_cache_only_if_the_cold_wave_was_a_batch(
    engine: type[FakeEngine],
) -> None:
    with pytest.raises(EquivalenceFailure) as info:
        v = Verifier(engine(concurrent=4, mix_rows=True))
        for _ in range(5):
            v.run_waves(WAVES)
    msg = str(info.value)
    if engine is SerialCold:
        assert f"{UNSEPARATED}: logits differ" in msg and CACHE_ONLY not in msg, msg
        assert "cold='reset' resets before each uncached run: the cold wave was no batch" in msg
    else:  # negative control: a cold wave sent together rules batching out
        assert f"{CACHE_ONLY}: logits differ" in msg and UNSEPARATED not in msg, msg


def test_an_openai_engine_says_when_its_cold_runs_go_one_at_a_time() -> None:
    url, other = "http://127.0.0.1:9", "http://127.0.0.1:8"
    reset = OpenAIEngine(url=url, cold="reset", cold_url=other, reset_paths=("/cache/clear",))
    assert traits_of(reset).cold_waves_serial == "cold='reset' resets before each uncached run"
    for together in (
        OpenAIEngine(url=url, cold="salt", namespace_header="x-ns"),
        OpenAIEngine(url=url, cold="server", cold_url=other),
    ):
        assert traits_of(together).cold_waves_serial == ""
