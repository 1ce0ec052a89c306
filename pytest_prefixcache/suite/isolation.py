"""The timing side-channel test that ``--prefixcache-isolation`` adds to the suite.

See :mod:`pytest_prefixcache.verify.isolation` (the measurement) and
:mod:`pytest_prefixcache.checks.timing` (the verdict): time to first token must not reveal
whether another namespace cached a prefix, and the same measurement within one namespace
must (the positive control), else the result is inconclusive and the test is skipped.
"""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Callable

import pytest

from pytest_prefixcache.checks.timing import IsolationFailure
from pytest_prefixcache.errors import EngineFault, EngineTimeout
from pytest_prefixcache.session.settings import Settings
from pytest_prefixcache.types import Outcome, Request
from pytest_prefixcache.verify.isolation import audit
from pytest_prefixcache.verify.verifier import Verifier
from pytest_prefixcache.verify.worker import CallTimedOut


def test_isolation(prefixcache_settings: Settings, prefixcache_verifier: Verifier) -> None:
    """Time to first token does not reveal another namespace's cached prefix (KS test)."""
    __tracebackhide__ = True
    s = prefixcache_settings
    worker, engine = prefixcache_verifier.worker, prefixcache_verifier.engine
    command = f"{shlex.quote(sys.executable)} -m pytest " + " ".join(
        [*s.flags(), "--prefixcache-isolation", f"--prefixcache-seed={s.seed}", "-k isolation"]
    )

    seconds = [0.0]

    def call(fn: Callable[[], object], what: str) -> object:
        try:
            res = worker.call(fn, timeout=s.timeout, what=what)
        except CallTimedOut as exc:
            raise EngineTimeout(f"timeout: {exc}\n  replay: {command}") from None
        if res.error is not None:
            name = type(res.error).__name__
            raise EngineFault(f"fault: {what} raised {name}: {res.error}\n  replay: {command}")
        seconds[0] = res.seconds
        return res.value

    def run(request: Request) -> tuple[Outcome, float]:
        fn = functools.partial(engine.run, request, use_cache=True)
        out = call(fn, f"run(namespace {request.namespace!r}, use_cache=True)")
        if not isinstance(out, Outcome):
            raise EngineFault(f"fault: run() returned a {type(out).__name__}, not an Outcome")
        return out, seconds[0]

    result = audit(run, seed=s.seed, reset=lambda: call(engine.reset, "engine.reset()"))
    detail = "\n  ".join(result.lines())
    if result.verdict == "leak":
        raise IsolationFailure(
            "isolation: time to first token reveals whether another namespace cached a "
            f"prefix (a cross-tenant timing side channel)\n  {detail}\n  replay: {command}"
        )
    if result.verdict == "inconclusive":
        pytest.skip(
            "isolation inconclusive: hits are not measurably faster than misses within one "
            f"namespace, so the measurement has no power ({result.lines()[1]})"
        )
