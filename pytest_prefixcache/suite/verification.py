"""The built-in prefix-cache verification suite (added by ``--prefixcache-verify``).

Order: the scenario corpus first, then generated request streams, then the state machine.
``--prefixcache-replay=PATH`` runs only ``test_replay``.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from pytest_prefixcache.errors import PrefixCacheError
from pytest_prefixcache.output.streams import corpus_files, load_stream, waves_from
from pytest_prefixcache.session.settings import STATEFUL_STEPS, Settings
from pytest_prefixcache.session.stash import DATABASE_KEY, START_KEY, settings_of
from pytest_prefixcache.stateful import machine_for
from pytest_prefixcache.strategies import (
    request_streams,
    request_waves,
    stream_kwargs,
    wave_kwargs,
)
from pytest_prefixcache.strategies._engine import capabilities
from pytest_prefixcache.strategies._moves import StreamSpec
from pytest_prefixcache.types import Request, Wave
from pytest_prefixcache.verify.concurrent import max_concurrency
from pytest_prefixcache.verify.parallel import lanes_for, parallel_from, run_parallel, separate
from pytest_prefixcache.verify.restarts import declares_restart, restarts_from, run_restart_stream
from pytest_prefixcache.verify.shrink_budget import ShrinkBudget, limit_for
from pytest_prefixcache.verify.verifier import Verifier

#: The waves property runs examples / WAVES_SHARE examples (a wave costs about three runs a
#: request: cached in the wave, cold alone, cold in the wave).
WAVES_SHARE = 5
#: Requests in flight in one wave at most, whatever the engine declares.
MAX_WAVE = 8
#: With parallel streams a group goes on after each stream with odds MORE_LANES : 1 (until
#: the lanes are full; one "more?" draw per stream, so shrinking deletes streams).
MORE_LANES = 15


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "corpus_file" in metafunc.fixturenames:
        files = corpus_files(metafunc.config.rootpath)
        for f in files:  # a malformed scenario is a usage error naming the file and field
            try:
                load_stream(f)
            except PrefixCacheError as exc:
                raise pytest.UsageError(f"corpus scenario: {exc}") from None
        metafunc.parametrize("corpus_file", files, ids=[f.stem for f in files])
    shards = settings_of(metafunc.config).shards
    if "shard" in metafunc.fixturenames and shards > 1:
        metafunc.parametrize("shard", range(shards), ids=[f"shard{i}" for i in range(shards)])


@pytest.fixture
def shard() -> int:
    """Which shard of the generated tests this is (0 when they are not split)."""
    return 0


def _rounds(config: pytest.Config, s: Settings, shard: int, share: float) -> Iterator[int]:
    """Seeds for one shard: one round, then more while ``share`` of --prefixcache-budget,
    counted from the session start, is left."""
    yield s.shard_seed(shard)
    if s.budget is None:
        return
    deadline = config.stash.get(START_KEY, time.monotonic()) + s.budget * share
    n = 1
    while time.monotonic() < deadline:
        yield s.shard_seed(shard, n)
        n += 1


def _hypothesis_settings(config: pytest.Config, s: Settings, **extra: Any) -> hsettings:
    kwargs: dict[str, Any] = {
        "max_examples": s.shard_examples(),
        "deadline": None,
        "database": config.stash.get(DATABASE_KEY, None),
        "derandomize": False,
        # no finding ends the search: after a positive-control failure the run goes on
        # generating swapped, replaced and repeated images, and shrinks each distinct failure
        "report_multiple_bugs": True,
        "print_blob": False,
        "phases": (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
        "suppress_health_check": list(HealthCheck),
    }
    kwargs.update(extra)
    return hsettings(**kwargs)


def shrink_budget(verifier: Verifier, s: Settings, examples: int) -> ShrinkBudget:
    """The budget of one run of a property of ``examples`` examples: what it may still run
    after its first failure (``--prefixcache-shrink-budget``), counted into the report."""
    return ShrinkBudget(limit_for(s.shrink_budget, examples), verifier.report)


def _timeout_first(verifier: Verifier, test: Callable[[], None]) -> None:
    """Run ``test``. After an engine call hangs, Hypothesis replays and shrinks against a dead
    engine and reports a flaky or shrunk example: report the timeout, with the stream that hung."""
    __tracebackhide__ = True
    try:
        test()
    except Exception:
        if verifier.dead is not None:
            raise verifier.dead.with_traceback(None) from None
        raise


def _capabilities(verifier: Verifier) -> tuple[bool, bool]:
    """(images, namespaces): what the verifier's engine says it supports."""
    return capabilities(verifier.engine)


def _skip_unsupported(verifier: Verifier, stream: tuple[Request, ...], name: str) -> None:
    images, namespaces = _capabilities(verifier)
    if not images and any(r.images for r in stream):
        pytest.skip(f"{name} has images and the engine says supports_images = False")
    if not namespaces and any(r.namespace for r in stream):
        pytest.skip(f"{name} uses namespaces and the engine says supports_namespaces = False")


def _run_scenario(verifier: Verifier, path: Any) -> None:
    """Run a saved stream, then the scenario's expectations (``expect_same_prompt`` pairs);
    a stream saved from the waves property runs as its waves."""
    __tracebackhide__ = True
    stream, meta = load_stream(path)
    _skip_unsupported(verifier, tuple(stream), f"scenario {Path(path).name}")
    try:
        waves = waves_from(stream, meta)
        lanes = parallel_from(stream, meta) if waves is None else None
    except PrefixCacheError as exc:
        raise pytest.UsageError(f"stream file {str(path)!r}: {exc}") from None
    if lanes is not None:
        k, why = lanes_for(verifier.engine, len(lanes))
        if k < len(lanes):
            pytest.skip(
                f"scenario {Path(path).name} runs {len(lanes)} streams in parallel and {why}"
            )
        run_parallel(verifier, lanes)
        return
    try:
        restarts = restarts_from(stream, meta) if waves is None and lanes is None else None
    except PrefixCacheError as exc:
        raise pytest.UsageError(f"stream file {str(path)!r}: {exc}") from None
    if restarts is not None:
        if not declares_restart(verifier.engine):
            pytest.skip(f"scenario {Path(path).name} restarts the engine, which declares none")
        run_restart_stream(verifier, restarts)
        return
    if waves is not None:
        k = max_concurrency(verifier.engine)
        if k < max(len(w) for w in waves):
            pytest.skip(
                f"scenario {Path(path).name} sends waves of up to {max(len(w) for w in waves)} "
                f"requests and the engine declares max_concurrency = {k}"
            )
        verifier.run_waves(waves)
        return
    steps = verifier.run(stream)
    verifier.expect_same_render(steps, meta.get("expect_same_prompt", ()))
    verifier.expect_same_render(steps, meta.get("expect_extends", ()), extends=True)


def test_corpus(corpus_file: Any, prefixcache_verifier: Verifier) -> None:
    """A known scenario (the oMLX A-E conversation, shared-prompt photos, ...)."""
    _run_scenario(prefixcache_verifier, corpus_file)


def test_request_streams(
    pytestconfig: pytest.Config,
    prefixcache_settings: Settings,
    prefixcache_verifier: Verifier,
    shard: int,
) -> None:
    """Generated request streams: every cached outcome equals the uncached one, and more."""
    s = prefixcache_settings
    streams = request_streams(**stream_kwargs(prefixcache_verifier.engine))
    lanes, why = lanes_for(prefixcache_verifier.engine, s.parallel_streams)
    if why:
        warnings.warn(
            f"--prefixcache-parallel-streams={s.parallel_streams}: {lanes} at once, as {why}",
            pytest.PytestWarning,
            stacklevel=1,
        )
    if lanes > 1:
        _parallel_streams(pytestconfig, s, prefixcache_verifier, shard, streams, lanes)
        return
    for round_seed in _rounds(pytestconfig, s, shard, share=0.6):
        budget = shrink_budget(prefixcache_verifier, s, s.shard_examples())

        # settings above seed: @seed alone would switch the example database off
        @_hypothesis_settings(pytestconfig, s)
        @seed(round_seed)
        @given(stream=streams)
        @budget.bounds
        def property_stream(stream: tuple[Request, ...]) -> None:
            prefixcache_verifier.run(stream)

        _timeout_first(prefixcache_verifier, property_stream)


def _groups(
    streams: st.SearchStrategy[tuple[Request, ...]], lanes: int
) -> st.SearchStrategy[tuple[tuple[Request, ...], ...]]:
    """Groups of up to ``lanes`` streams, each in namespaces of its own; they shrink toward
    one stream (which runs alone, as on the sequential path)."""

    @st.composite
    def build(draw: st.DrawFn) -> tuple[tuple[Request, ...], ...]:
        group = [draw(streams)]
        while len(group) < lanes and draw(st.integers(0, MORE_LANES)):
            group.append(draw(streams))
        return separate(group)

    return build()


def _parallel_streams(
    config: pytest.Config,
    s: Settings,
    verifier: Verifier,
    shard: int,
    streams: st.SearchStrategy[tuple[Request, ...]],
    lanes: int,
) -> None:
    """The generated streams in groups of ``lanes`` at once (``--prefixcache-parallel-streams``,
    :mod:`pytest_prefixcache.verify.parallel`): as many streams in all as one at a time."""
    __tracebackhide__ = True
    groups = _groups(streams, lanes)
    for round_seed in _rounds(config, s, shard, share=0.6):
        budget = shrink_budget(verifier, s, s.shard_examples(lanes))

        @_hypothesis_settings(config, s, max_examples=s.shard_examples(lanes))
        @seed(round_seed)
        @given(group=groups)
        @budget.bounds
        def property_parallel_streams(group: tuple[tuple[Request, ...], ...]) -> None:
            run_parallel(verifier, group)

        _timeout_first(verifier, property_parallel_streams)


def test_waves(
    pytestconfig: pytest.Config,
    prefixcache_settings: Settings,
    prefixcache_verifier: Verifier,
    shard: int,
) -> None:
    """Concurrent waves (engines that declare ``max_concurrency`` above 1): every cached reply
    in a wave equals the same request served alone, cold; a cold wave is the noise control."""
    k = min(MAX_WAVE, max_concurrency(prefixcache_verifier.engine))
    if k < 2:
        pytest.skip("the engine declares no concurrent service (max_concurrency above 1)")
    waves = request_waves(max_size=k, **wave_kwargs(prefixcache_verifier.engine))
    s = prefixcache_settings
    for round_seed in _rounds(pytestconfig, s, shard, share=0.8):
        budget = shrink_budget(prefixcache_verifier, s, s.shard_examples(WAVES_SHARE))

        @_hypothesis_settings(pytestconfig, s, max_examples=s.shard_examples(WAVES_SHARE))
        @seed(round_seed)
        @given(waves=waves)
        @budget.bounds
        def property_waves(waves: tuple[Wave, ...]) -> None:
            prefixcache_verifier.run_waves(waves)

        _timeout_first(prefixcache_verifier, property_waves)


def test_state_machine(
    pytestconfig: pytest.Config,
    prefixcache_settings: Settings,
    prefixcache_verifier: Verifier,
    shard: int,
) -> None:
    """The same checks driven one request at a time by a RuleBasedStateMachine."""
    images, namespaces = _capabilities(prefixcache_verifier)
    spec = StreamSpec(
        namespaces=StreamSpec().namespaces if namespaces else ("",),
        max_images_per_message=StreamSpec().max_images_per_message if images else 0,
    )
    s = prefixcache_settings
    settings = _hypothesis_settings(
        pytestconfig, s, max_examples=s.shard_examples(2), stateful_step_count=STATEFUL_STEPS
    )
    for round_seed in _rounds(pytestconfig, s, shard, share=1.0):
        budget = shrink_budget(prefixcache_verifier, s, s.shard_examples(2))
        machine = seed(round_seed)(machine_for(prefixcache_verifier, spec, budget))
        run = functools.partial(run_state_machine_as_test, machine, settings=settings)
        _timeout_first(prefixcache_verifier, run)


def test_replay(prefixcache_settings: Settings, prefixcache_verifier: Verifier) -> None:
    """The stream saved by an earlier failure (``--prefixcache-replay=PATH``), exactly."""
    path = prefixcache_settings.replay
    if path is None:
        pytest.skip("no --prefixcache-replay given")
    _run_scenario(prefixcache_verifier, path)
