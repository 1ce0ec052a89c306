"""The restart streams that ``--prefixcache-restarts`` adds to the suite.

See :mod:`pytest_prefixcache.verify.restarts` (driving the engine's ``restart(changed)``) and
:mod:`pytest_prefixcache.checks.restart` (``stale identity``). Collected only with the option.
"""

from __future__ import annotations

import pytest
from hypothesis import given, seed

from pytest_prefixcache.session.settings import Settings
from pytest_prefixcache.strategies import Restart, restart_streams, stream_kwargs
from pytest_prefixcache.suite.verification import (  # the suite's shards, and its settings
    _hypothesis_settings,
    _rounds,
    _timeout_first,
    pytest_generate_tests,
    shard,
    shrink_budget,
)
from pytest_prefixcache.types import Request
from pytest_prefixcache.verify.restarts import declares_restart, restart_changes, run_restart_stream
from pytest_prefixcache.verify.verifier import Verifier

__all__ = ["RESTARTS_SHARE", "pytest_generate_tests", "shard", "test_restart_streams"]

#: The restart streams run examples / RESTARTS_SHARE examples.
RESTARTS_SHARE = 2


def test_restart_streams(
    pytestconfig: pytest.Config,
    prefixcache_settings: Settings,
    prefixcache_verifier: Verifier,
    shard: int,
) -> None:
    """Generated streams with restarts between requests (``--prefixcache-restarts``): what
    the engine restores equals cold; nothing from before a changed restart is reused."""
    s = prefixcache_settings
    engine = prefixcache_verifier.engine
    if not declares_restart(engine):
        pytest.skip(
            f"{type(engine).__name__} declares no restart(changed) with storage that outlives "
            "it (persists)"
        )
    streams = restart_streams(changes=restart_changes(engine), **stream_kwargs(engine))
    for round_seed in _rounds(pytestconfig, s, shard, share=0.6):
        budget = shrink_budget(prefixcache_verifier, s, s.shard_examples(RESTARTS_SHARE))

        @_hypothesis_settings(pytestconfig, s, max_examples=s.shard_examples(RESTARTS_SHARE))
        @seed(round_seed)
        @given(stream=streams)
        @budget.bounds
        def property_restart_streams(stream: tuple[Request | Restart, ...]) -> None:
            run_restart_stream(prefixcache_verifier, stream)

        _timeout_first(prefixcache_verifier, property_restart_streams)
