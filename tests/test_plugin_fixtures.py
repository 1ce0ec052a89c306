"""The fixtures engine authors use in their own tests, and overriding the engine in conftest."""

from __future__ import annotations

import pytest
from plugin_support import run_suite, with_fakes

pytest_plugins = ["pytester"]

# The property test docs/adapters.md shows (tests/test_docs.py checks that it does).
README_TEST = """
from hypothesis import given, settings
from pytest_prefixcache import Message, Request
from pytest_prefixcache.strategies import request_streams


@settings(max_examples=25, deadline=None, derandomize=True)
@given(stream=request_streams())
def test_cached_equals_uncached(prefixcache_verify, stream):
    prefixcache_verify(stream)


def test_same_size_images_never_collide(prefixcache_verify, prefixcache_images):
    red = prefixcache_images.solid(64, 64, color=(255, 0, 0))
    blue = prefixcache_images.solid(64, 64, color=(0, 0, 255))
    ask = lambda img: Request((Message("user", (img, "What colour is this?")),))
    [step] = prefixcache_verify(ask(blue), history=[ask(red)])
    assert step.cached.cached_tokens < step.match.shared + 1
"""

CONFTEST = """
import pytest
import fakeengines


@pytest.fixture(scope="session")
def prefixcache_engine():
    return fakeengines.FakeEngine({flags})
"""


def test_readme_property_test_passes_on_a_correct_engine(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makeconftest(CONFTEST.format(flags=""))
    pytester.makepyfile(test_readme=README_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*= prefixcache =*", "requests run: *", "failures by check: none"])


@pytest.mark.slow
def test_readme_property_test_catches_a_collision(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makeconftest(CONFTEST.format(flags="ignore_digest=True"))
    pytester.makepyfile(test_readme=README_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "E   pytest_prefixcache.errors.EquivalenceFailure: equivalence: logits differ *",
            "E     replay: * -m pytest --prefixcache-verify --prefixcache-replay=.prefixcache/*",
        ]
    )
    result.stdout.fnmatch_lines(["failures by check: equivalence: 2"])
    saved = list((pytester.path / ".prefixcache" / "failures").glob("*/stream.json"))
    assert len(saved) == 2
    # The fixture and the Outcomes print as one line each in Hypothesis's falsifying example,
    # not field by field (the Verifier's whole Report once made this section 3,600 lines).
    out = result.stdout.lines
    start = out.index(next(line for line in out if " test_cached_equals_uncached " in line))
    end = out.index(next(line for line in out if " test_same_size_images_never_collide " in line))
    assert end - start < 100, "\n".join(out[start:end])
    assert "overly large repr" not in result.stdout.str()


def test_conftest_override_drives_the_built_in_suite(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    # The overriding engine drifts on every cache hit, which any stream with a repeated prefix
    # reaches: this test is about the override, not search power (a hit inside an image, the
    # bad_merge fake's trigger, was missed by 20 examples of some seeds in CI: in-process,
    # Hypothesis also draws constants from the modules loaded, so a seed alone does not pin it).
    pytester.makeconftest(CONFTEST.format(flags="drift=True"))
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-examples=20",
        "--prefixcache-seed=1", "-k", "request_streams",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E   pytest_prefixcache.errors.EquivalenceFailure: equivalence*"])


def test_verify_resets_the_engine_for_each_call(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makeconftest(CONFTEST.format(flags=""))
    pytester.makepyfile(
        test_reset="""
        from pytest_prefixcache import Message, Request

        def test_reset(prefixcache_engine, prefixcache_verify):
            req = Request((Message("user", ("hello " * 40,)),))
            before = prefixcache_engine.resets
            [first] = prefixcache_verify(req)
            [second] = prefixcache_verify(req)
            assert prefixcache_engine.resets == before + 2
            assert first.cached.cached_tokens == second.cached.cached_tokens == 0
            [third] = prefixcache_verify(req, history=[req])
            assert third.cached.cached_tokens > 0
            [fourth] = prefixcache_verify(req, reset=False)
            assert fourth.cached.cached_tokens > 0
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_images_fixture_is_deterministic(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_images="""
        def test_images(prefixcache_images):
            a = prefixcache_images.noise(33, 17, seed=4)
            assert a == prefixcache_images("noise", 33, 17, seed=4)
            assert a.size == (33, 17)
            assert prefixcache_images.reencode(a, "BMP") == a
            kinds = [prefixcache_images(p, 16, 16, seed=1) for p in prefixcache_images.patterns]
            assert len(set(kinds)) == 4
            px = prefixcache_images.solid(8, 8, color=(1, 2, 3)).pixels
            assert px[0, 0].tolist() == [1, 2, 3]
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_state_machine_finds_a_collision(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "ignore_digest", "-k", "state_machine", examples=40)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E *pytest_prefixcache.errors.EquivalenceFailure: equivalence: *",
            "*state.first_conversation(*",
        ]
    )
