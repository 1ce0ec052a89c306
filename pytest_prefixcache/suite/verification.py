"""The built-in prefix-cache verification suite (added by ``--prefixcache-verify``).

Order: the scenario corpus first, then generated request streams, then the state machine.
``--prefixcache-replay=PATH`` runs only ``test_replay``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed
from hypothesis import settings as hsettings
from hypothesis.stateful import run_state_machine_as_test

from pytest_prefixcache._moves import MOVES, StreamSpec
from pytest_prefixcache.errors import PrefixCacheError
from pytest_prefixcache.output.streams import corpus_files, load_stream
from pytest_prefixcache.session.settings import STATEFUL_STEPS, Settings
from pytest_prefixcache.session.stash import DATABASE_KEY, START_KEY, settings_of
from pytest_prefixcache.stateful import machine_for
from pytest_prefixcache.strategies import CLOSED_LOOP_SHARE, request_streams
from pytest_prefixcache.types import Request
from pytest_prefixcache.verify.verifier import Verifier


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


IMAGE_MOVES = ("replace", "swap", "reencode")


def _capabilities(verifier: Verifier) -> tuple[bool, bool]:
    """(images, namespaces): what the engine says it supports (``supports_images`` and
    ``supports_namespaces`` attributes; both assumed when absent)."""
    engine = verifier.engine
    return (
        getattr(engine, "supports_images", True) is not False,
        getattr(engine, "supports_namespaces", True) is not False,
    )


def _stream_kwargs(verifier: Verifier) -> dict[str, Any]:
    """request_streams() arguments that stay within the engine's capabilities."""
    images, namespaces = _capabilities(verifier)
    moves = [m for m in MOVES if (images or m not in IMAGE_MOVES)]
    moves = [m for m in moves if (namespaces or m != "namespace")]
    kwargs: dict[str, Any] = {"moves": tuple(moves), "closed_loop": CLOSED_LOOP_SHARE}
    if not images:
        kwargs["max_images_per_message"] = 0
    if not namespaces:
        kwargs["namespaces"] = ("",)
    return kwargs


def _skip_unsupported(verifier: Verifier, stream: tuple[Request, ...], name: str) -> None:
    images, namespaces = _capabilities(verifier)
    if not images and any(r.images for r in stream):
        pytest.skip(f"{name} has images and the engine says supports_images = False")
    if not namespaces and any(r.namespace for r in stream):
        pytest.skip(f"{name} uses namespaces and the engine says supports_namespaces = False")


def _run_scenario(verifier: Verifier, path: Any) -> None:
    """Run a saved stream, then the scenario's expectations (``expect_same_prompt`` pairs)."""
    __tracebackhide__ = True
    stream, meta = load_stream(path)
    _skip_unsupported(verifier, tuple(stream), f"scenario {Path(path).name}")
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
    streams = request_streams(**_stream_kwargs(prefixcache_verifier))
    for round_seed in _rounds(pytestconfig, s, shard, share=0.6):
        # settings above seed: @seed alone would switch the example database off
        @_hypothesis_settings(pytestconfig, s)
        @seed(round_seed)
        @given(stream=streams)
        def property_stream(stream: tuple[Request, ...]) -> None:
            prefixcache_verifier.run(stream)

        _timeout_first(prefixcache_verifier, property_stream)


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
        machine = seed(round_seed)(machine_for(prefixcache_verifier, spec))
        run = functools.partial(run_state_machine_as_test, machine, settings=settings)
        _timeout_first(prefixcache_verifier, run)


def test_replay(prefixcache_settings: Settings, prefixcache_verifier: Verifier) -> None:
    """The stream saved by an earlier failure (``--prefixcache-replay=PATH``), exactly."""
    path = prefixcache_settings.replay
    if path is None:
        pytest.skip("no --prefixcache-replay given")
    _run_scenario(prefixcache_verifier, path)
