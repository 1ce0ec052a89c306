"""--prefixcache-timeout: a hung engine fails once with the reproducer, then everything skips."""

from __future__ import annotations

import pytest
from plugin_support import REPLAY_LINE, run_file, run_suite, with_fakes

pytest_plugins = ["pytester"]


@pytest.mark.timing
def test_hung_engine_fails_then_the_rest_is_skipped(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makepyfile(
        test_mine="""
        def test_uses_the_engine(prefixcache_verify):
            pass

        def test_does_not():
            pass
        """
    )
    # The engine hangs for an hour on its first cache hit. The session ends anyway (the hung
    # call is abandoned on its daemon thread); the subprocess's timeout only guards against a
    # session that waits for it, which would otherwise hang the test run.
    result = run_suite(
        pytester, "hangs", "--prefixcache-timeout=1", "-rs", subprocess=True, timeout=600
    )
    result.stdout.fnmatch_lines(
        [
            "E   pytest_prefixcache.errors.EngineTimeout: timeout: run(request 1, use_cache=True) "
            "did not answer within 1 s; the engine is treated as dead and the remaining checks "
            "are skipped",
            "E     at request 1 of a stream of *",
            f"E     replay: {REPLAY_LINE}",
        ]
    )
    assert run_file(pytester.path)["flags"][1:] == [
        "--prefixcache-engine=fakeengines:hangs",
        "--prefixcache-timeout=1",
    ]
    result.stdout.fnmatch_lines(
        [
            "SKIPPED [[]*] *: the engine is dead (run(request 1, use_cache=True) did not answer "
            "within 1 s); remaining checks skipped"
        ]
    )
    # The user's tests run first (they come first on the command line); then the corpus's
    # first scenario meets the hang, and every later test that needs the engine is skipped.
    result.assert_outcomes(failed=1, passed=2, skipped=7)
    result.stdout.fnmatch_lines(["failures by check: timeout: 1"])
