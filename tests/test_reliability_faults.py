"""The plugin under faulty engines: a clear, specific failure with a replay path, within the
timeout, never a hung or crashed session; a hung engine call does not keep pytest alive."""

from __future__ import annotations

import pytest
from plugin_support import REPLAY_LINE, run_file, with_fakes

pytest_plugins = ["pytester"]

FAULTY = """
import dataclasses
import threading

import numpy as np

from fakeengines import FakeEngine


class Faulty(FakeEngine):
    def __init__(self, fault, at=0):
        super().__init__()
        self.fault, self.at, self.n = fault, at, 0

    def run(self, request, *, use_cache):
        self.n += 1
        if self.fault == "hang" and self.n > self.at:
            threading.Event().wait()  # forever: the call never returns
        out = super().run(request, use_cache=use_cache)
        hit = bool(out.cached_tokens)
        f, rep = self.fault, dataclasses.replace
        if f == "inf" and hit:
            logits = out.logits.copy()
            logits[3] = np.inf
            return rep(out, logits=logits)
        if f == "rows" and hit:
            return rep(out, logits=out.logits[None, :])
        if f == "half" and not use_cache:
            return rep(out, logits=out.logits.astype(np.float16))
        if f == "short_step" and hit and len(out.step_logits) > 1:
            return rep(out, step_logits=(out.step_logits[0], out.step_logits[1][:-5]))
        if f == "overcount" and hit:
            return rep(out, cached_tokens=out.prompt_tokens + 3)
        if f == "none" and hit:
            return None
        return out


def _at(fault, at=0):
    return lambda: Faulty(fault, at)


hang_after_5 = _at("hang", 5)
hang_forever = _at("hang")
inf = _at("inf")
rows = _at("rows")
half = _at("half")
short_step = _at("short_step")
overcount = _at("overcount")
none = _at("none")
"""


def _setup(pytester: pytest.Pytester) -> pytest.Pytester:
    with_fakes(pytester)
    pytester.makepyfile(faulty=FAULTY)
    return pytester


def _run(pytester: pytest.Pytester, name: str, *args: str, **kw: object) -> pytest.RunResult:
    argv = [
        "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning",
        "--prefixcache-verify", f"--prefixcache-engine=faulty:{name}",
        "--prefixcache-examples=30", "--prefixcache-seed=1", "-k", "request_streams", *args,
    ]  # fmt: skip
    if kw.get("subprocess"):
        return pytester.runpytest_subprocess(*argv, timeout=600)  # a guard against a hang
    return pytester.runpytest(*argv)


FAULTS = [
    ("inf", "EngineFault", "fault: cached run: logits holds 1 non-finite value(s), first inf at "
     "token id 3"),
    ("rows", "EngineFault", "fault: cached run: logits has shape (1, 300), expected "
     "(vocab_size,)"),
    ("half", "EngineFault", "fault: uncached run: logits has dtype float16, expected float32"),
    ("short_step", "EngineFault", "fault: cached run: step_logits[[]1[]] has shape (295,) but "
     "logits (300,)"),
    ("overcount", "EngineFault", "fault: cached run: cached_tokens=* exceeds prompt_tokens=*"),
    ("none", "EngineFault", "fault: cached run: run() returned a NoneType, not an Outcome"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "error", "line"), FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_is_specific_and_replayable(
    pytester: pytest.Pytester, name: str, error: str, line: str
) -> None:
    _setup(pytester)
    result = _run(pytester, name)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            f"E   pytest_prefixcache.errors.{error}: {line}",
            "E     at request * of a stream of * (counting from 0)",
            f"E     replay: {REPLAY_LINE}",
        ]
    )
    assert run_file(pytester.path)["flags"][1:] == [f"--prefixcache-engine=faulty:{name}"]
    result.stdout.fnmatch_lines(["failures by check: fault: 1"])
    saved = list(pytester.path.glob(".prefixcache/failures/*/stream.json"))
    assert len(saved) == 1
    again = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", f"--prefixcache-engine=faulty:{name}",
        f"--prefixcache-replay={saved[0].relative_to(pytester.path)}",
    )  # fmt: skip
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines([f"E   pytest_prefixcache.errors.{error}: {line}"])


@pytest.mark.slow
@pytest.mark.timing
def test_engine_that_hangs_after_a_particular_request(pytester: pytest.Pytester) -> None:
    _setup(pytester)
    # The call hangs forever: the run ending at all shows the session did not wait for it.
    result = _run(pytester, "hang_after_5", "--prefixcache-timeout=1", subprocess=True)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E *pytest_prefixcache.errors.EngineTimeout: timeout: run(request *, use_cache=*) "
            "did not answer within 1 s; the engine is treated as dead and the remaining checks "
            "are skipped",
            f"E *replay: {REPLAY_LINE}",
        ]
    )
    assert run_file(pytester.path)["flags"][1:] == [
        "--prefixcache-engine=faulty:hang_after_5",
        "--prefixcache-timeout=1",
    ]
    result.stdout.fnmatch_lines(["failures by check: timeout: 1"])
    assert list(pytester.path.glob(".prefixcache/failures/*/stream.json"))


@pytest.mark.slow
@pytest.mark.timing
def test_a_forever_hung_call_does_not_keep_the_interpreter_alive(
    pytester: pytest.Pytester,
) -> None:
    """The hung worker thread is a daemon: pytest exits as soon as the session ends. The call
    never returns, so the run ending at all shows it; the timeout only turns a session that
    would wait forever into a failure."""
    _setup(pytester)
    pytester.makepyfile(test_mine="def test_after(prefixcache_verify):\n    pass\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--prefixcache-verify",
        "--prefixcache-engine=faulty:hang_forever", "--prefixcache-timeout=1",
        "--prefixcache-examples=2", "-rs", timeout=600,
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*EngineTimeout: timeout: run(request 0, use_cache=True) *"])
    result.stdout.fnmatch_lines(["SKIPPED * the engine is dead (*); remaining checks skipped"])
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 1 and outcomes["skipped"] >= 2
