"""The restart streams (``--prefixcache-restarts``): the strategy, the ``stale identity``
check, a saved stream's restarts, and the verifier driving an engine's ``restart``."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from pytest_prefixcache.checks.oracle import ReuseOracle
from pytest_prefixcache.checks.restart import STALE, stale_problems
from pytest_prefixcache.errors import PrefixCacheError, VerificationFailure
from pytest_prefixcache.strategies import Restart, restart_streams
from pytest_prefixcache.types import Message, Outcome, Request
from pytest_prefixcache.verify.restarts import restarts_from, run_restart_stream
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions

ROOT = Path(__file__).resolve().parent.parent
R = Request((Message("user", ("describe the image",)),))


def _outcome(cached: int) -> Outcome:
    import numpy as np

    return Outcome(logits=np.zeros(4), cached_tokens=cached, prompt_tokens=30)


@settings(max_examples=30, database=None)
@given(st.data())
def test_restart_streams_draw_restarts_between_requests(data: st.DataObject) -> None:
    items = data.draw(restart_streams(changes=("weights", "kv_dtype"), max_images_per_message=0))
    assert isinstance(items[0], Request)  # never before the first request
    changed = [i.changed for i in items if isinstance(i, Restart) and i.changed]
    assert len(changed) == len(set(changed))  # each change at most once a stream
    assert not any(
        isinstance(a, Restart) and isinstance(b, Restart) for a, b in itertools.pairwise(items)
    )


def test_restart_streams_shrink_toward_no_restart() -> None:
    from hypothesis import find

    smallest = find(restart_streams(changes=("weights",)), lambda s: len(s) >= 2)
    assert not any(isinstance(i, Restart) for i in smallest)
    with_one = find(
        restart_streams(changes=("weights",)), lambda s: any(isinstance(i, Restart) for i in s)
    )
    assert [i for i in with_one if isinstance(i, Restart)] == [Restart(None)]
    with pytest.raises(InvalidArgument, match="changes='weights'"):
        restart_streams(changes="weights")


def test_stale_identity_check_and_its_control() -> None:
    oracle = ReuseOracle()
    match = oracle.match("", tuple(range(30)), ())  # nothing computed since the restart
    (problem,) = stale_problems(_outcome(21), match, "weights")
    assert problem.check == STALE and "weights changed" in problem.headline
    assert "at most 0 tokens" in problem.headline
    assert stale_problems(_outcome(0), match, "weights") == []  # reused nothing: fine
    assert stale_problems(_outcome(21), match, None) == []  # same configuration: the bound's


def test_saved_restarts_are_put_back_and_bad_ones_named() -> None:
    stream = (R, R, R)
    items = restarts_from(stream, {"restarts": [[1, "weights"], [2, None]]})
    assert items == (R, Restart("weights"), R, Restart(None), R)
    assert restarts_from(stream, {}) is None
    for bad in ([[0, None]], [[3, None]], [["1", None]], [[1, 2]], "x"):
        with pytest.raises(PrefixCacheError, match="restarts"):
            restarts_from(stream, {"restarts": bad})


def test_verifier_restarts_the_engine_and_judges_stale_identity(model: Any, tmp_path: Path) -> None:
    from reference_engine import Engine
    from reference_engine.mutants import MUTANTS

    options = VerifyOptions(failures_dir=tmp_path / "failures", timeout=600.0)
    stream = (R, Restart(None), R, Restart("weights"), R, R)
    verifier = Verifier(Engine(model, cache_dir=tmp_path / "kv"), options=options)
    steps = run_restart_stream(verifier, stream)
    assert [s.cached.cached_tokens > 0 for s in steps] == [False, True, False, True]
    assert verifier.report.coverage["restart"] == {"applied": 2}
    assert verifier.report.coverage[STALE] == {"applied": 2}
    # the negative control: the key without the weights' digest restores the old model's KV
    mutant = MUTANTS["model_digest_missing"].build(model)
    with pytest.raises(VerificationFailure) as info:
        run_restart_stream(Verifier(mutant, options=options), stream)
    assert info.value.check == STALE and info.value.request_index == 2
    assert "restarts in this stream: before request 1 (same configuration), before request 2 " \
        "(weights changed)" in str(info.value)  # fmt: skip
    assert info.value.meta["restarts"] == [[1, None], [2, "weights"]]


def test_an_engine_without_restart_is_counted_not_guessed(model: Any, tmp_path: Path) -> None:
    class NoRestart:
        def __init__(self, engine: Any) -> None:
            self.engine = engine

        def run(self, request: Request, *, use_cache: bool = True) -> Outcome:
            return self.engine.run(request, use_cache=use_cache)  # type: ignore[no-any-return]

        def reset(self) -> None:
            self.engine.reset()

    from reference_engine import Engine

    options = VerifyOptions(failures_dir=tmp_path, timeout=600.0)
    verifier = Verifier(NoRestart(Engine(model)), options=options)  # type: ignore[arg-type]
    run_restart_stream(verifier, (R, Restart(None), R))
    assert verifier.report.coverage["restart"] == {"no restart() declared": 1}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("engine", "code", "says"),
    [
        ("reference_engine:default_engine", 0, "stale identity"),
        ("reference_engine.mutants:model_digest_missing", 1, "stale identity: cached_tokens="),
    ],
)
def test_the_option_runs_the_restart_streams(
    tmp_path: Path, engine: str, code: int, says: str
) -> None:
    """``--prefixcache-restarts`` end to end: the unmodified engine passes with the coverage
    rows shown; the mutant fails on stale identity. The disk directory is removed."""
    import os

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "TMPDIR": str(scratch)}
    cmd = [
        sys.executable, "-m", "pytest", "--prefixcache-verify", "--prefixcache-restarts",
        f"--prefixcache-engine={engine}", "--prefixcache-examples=10", "--prefixcache-seed=0",
        "-k", "restart", "-p", "no:cacheprovider", "-q",
    ]  # fmt: skip
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    out = res.stdout + res.stderr
    assert res.returncode == code, out
    assert says in out and "  restart " in out, out
    assert not list(scratch.glob("pckv-*")), "the disk tier's directory was left behind"


@pytest.mark.slow
def test_the_reference_server_restarts_over_its_cache_dir(tmp_path: Path) -> None:
    """A server restart through the adapter: the same command, the same ``--cache-dir``;
    the restarted server restores the prefix. The control: without a cache dir it restores
    nothing, and the engine does not declare ``persists``."""
    from pytest_prefixcache.adapters.http.openai import OpenAIEngine
    from pytest_prefixcache.verify.restarts import declares_restart

    long = Request((Message("system", ("You are a careful visual assistant. " * 8,)),
                    Message("user", ("describe the image",))))  # fmt: skip
    base = "{python} -m reference_engine.server --host 127.0.0.1 --port {port}"
    options = VerifyOptions(failures_dir=tmp_path / "failures", timeout=600.0)
    for extra, reused in ((f" --cache-dir {tmp_path / 'kv'}", True), ("", False)):
        # the cold and fresh servers without the storage path: a cold run restores nothing
        with OpenAIEngine(base + extra, cold_cmd=base) as engine:
            engine.persists = bool(extra)
            assert declares_restart(engine) is reused
            verifier = Verifier(engine, options=options)
            steps = run_restart_stream(verifier, (long, Restart(None), long))
            assert ((steps[1].cached.cached_tokens or 0) > 0) == reused
            assert verifier.report.coverage["restart"] == {"applied": 1}
