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
from pytest_prefixcache.traits import traits_of
from pytest_prefixcache.types import Outcome, Request
from pytest_prefixcache.verify.isolation import audit, identity_pairs
from pytest_prefixcache.verify.verifier import Verifier
from pytest_prefixcache.verify.worker import CallTimedOut


def test_isolation(prefixcache_settings: Settings, prefixcache_verifier: Verifier) -> None:
    """Time to first token does not reveal another namespace's or adapter's cached prefix (KS
    test, one audit per pair of identities, each with its positive control)."""
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
        adapter = "" if request.adapter is None else f", adapter {request.adapter!r}"
        out = call(fn, f"run(namespace {request.namespace!r}{adapter}, use_cache=True)")
        if not isinstance(out, Outcome):
            raise EngineFault(f"fault: run() returned a {type(out).__name__}, not an Outcome")
        return out, seconds[0]

    traits = traits_of(engine)
    pairs = identity_pairs(traits.supports_namespaces, tuple(traits.adapters))
    if not pairs:
        pytest.skip("isolation: the engine takes neither namespaces nor adapters")
    reset = lambda: call(engine.reset, "engine.reset()")  # noqa: E731
    results = {label: audit(run, seed=s.seed, reset=reset, across=pair, label=label)
               for label, pair in pairs.items()}  # fmt: skip
    for label, result in results.items():
        if result.verdict == "leak":
            who = "namespace" if label == "namespaces" else f"identity ({label})"
            detail = "\n  ".join(result.lines())
            raise IsolationFailure(
                f"isolation: time to first token reveals whether another {who} "
                f"cached a prefix (a cross-tenant timing side channel)\n  {detail}\n  "
                f"replay: {command}"
            )
    powerless = [f"{label}: {r.lines()[1]}" for label, r in results.items() if r.verdict != "pass"]
    if powerless:
        pytest.skip(
            "isolation inconclusive: hits are not measurably faster than misses within one "
            f"identity, so the measurement has no power ({'; '.join(powerless)})"
        )
