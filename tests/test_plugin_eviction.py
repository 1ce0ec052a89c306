"""Streams hold more distinct prefixes than a small cache: eviction must not cause false alarms
(and the oracle's maximum stays an upper bound, so efficiency just drops)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, seed, settings
from plugin_engines import FakeEngine

from pytest_prefixcache import Request, Verifier
from pytest_prefixcache.strategies import request_streams


def test_a_small_cache_evicts_and_still_passes_every_check() -> None:
    engine = FakeEngine(capacity_blocks=100)  # 800 tokens: two or three prompts
    verifier = Verifier(engine)

    @seed(7)
    @settings(max_examples=60, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(request_streams())
    def streams(stream: tuple[Request, ...]) -> None:
        verifier.run(stream)

    streams()
    assert engine.evictions > 100
    eff = verifier.report.efficiency
    assert verifier.report.cache_hits > 0 and eff is not None and 0 < eff < 1
