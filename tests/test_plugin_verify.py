"""End to end: the suite passes on a correct engine and fails, readably, on broken ones."""

from __future__ import annotations

import re

import pytest
from plugin_support import REPLAY_LINE, run_file, run_suite, with_fakes

pytest_plugins = ["pytester"]


def test_good_engine_passes_every_check(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "good")
    result.assert_outcomes(passed=7, skipped=1)  # test_waves: no max_concurrency declared
    result.stdout.fnmatch_lines(
        [
            "*= prefixcache =*",
            "engine: fakeengines:good; tolerance: exact",
            "requests run: * in * stream(s), * with cache hits",
            "cache efficiency vs the token oracle: *% (* of * reusable tokens)",
            "worst |cached - uncached|: 0",
            "merges checked: *",
            "failures by check: none",
            "reproduce with --prefixcache-seed=1",
        ]
    )


def test_works_in_a_directory_with_no_tests(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "good", "-v")
    result.stdout.fnmatch_lines(
        [
            "*verification.py::test_corpus[[]three_images_red_blue_green[]] PASSED*",
            "*verification.py::test_request_streams PASSED*",
            "*verification.py::test_state_machine PASSED*",
        ]
    )
    assert result.ret == 0


def test_without_the_flag_nothing_is_added(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("prefixcache: engine*")
    result.stdout.no_fnmatch_line("*= prefixcache =*")


def test_user_tests_run_alongside_the_suite(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    result = run_suite(pytester, "good")
    result.assert_outcomes(passed=8, skipped=1)  # test_waves: no max_concurrency declared


# (engine, check, lines the failure message must contain)
BROKEN = [
    (
        "ignore_digest",
        "EquivalenceFailure",
        [
            "*equivalence: logits differ beyond the tolerance (exact) at 1 of 1 step(s)",
            "*at request * of a stream of * (counting from 0)",
            "*first difference: step 0 (last prompt position), token id *: cached * vs uncached *",
            "*worst difference: step 0 (last prompt position), token id *",
            "*cached_tokens=* of prompt_tokens=*; oracle maximum valid reuse *, shared with *",
            "*image span involved: [[]*, *) digest * (image * of *, * placeholders)",
            "*also (reuse bound): cached_tokens=* exceeds the maximum valid reuse of * tokens",
            f"*replay: {REPLAY_LINE}",
        ],
    ),
    (  # a key without the namespace: the isolation check names the other tenant's prompt
        "ignore_namespace",
        "IsolationFailure",
        [
            "*isolation: cached_tokens=* in namespace 'tenant-b': its own identity allows at "
            "most 0, but namespace '' sent a prompt sharing * tokens",
            "*oracle maximum valid reuse 0 (no earlier request in namespace 'tenant-b' shares a "
            "prefix)",
            "*>[[]*[]] namespace='tenant-b'*",
        ],
    ),
    (
        "bad_merge",
        "ShapeFailure",
        [
            "*shapes: vision merge 0 filled * placeholder slots with * embedding rows",
            "*image span involved: [[]*",
        ],
    ),
    (
        "lie",
        "ReuseBoundFailure",
        [
            "*reuse bound: cached_tokens=8 exceeds the maximum valid reuse of 0 tokens",
            "*at request 0 of a stream of 1 (counting from 0)",
        ],
    ),
    (
        "never_store",
        "PositiveControlFailure",
        [
            "*positive control: an identical repeat of the previous request reused 0 tokens; "
            "* were reusable"
        ],
    ),
    (
        "rerender",
        "PositiveControlFailure",
        ["*positive control: an append-only next turn of the previous request reused 0 tokens*"],
    ),
    (
        "raises",
        "EngineFault",
        [
            "*fault: run(request 1, use_cache=True) raised RuntimeError: cache corrupted while "
            "restoring a block",
            "*RuntimeError: cache corrupted while restoring a block",
        ],
    ),
    (
        "nan",
        "EngineFault",
        ["*fault: cached run: logits holds 1 non-finite value(s), first nan at token id 7"],
    ),
    (
        "wrong_shape",
        "EngineFault",
        ["*fault: logits shape differs: cached (299,) vs uncached (300,)"],
    ),
    (
        "wrong_dtype",
        "EngineFault",
        ["*fault: cached run: logits has dtype float64, expected float32"],
    ),
    ("drift", "EquivalenceFailure", ["*cached * vs uncached * (|diff| *e-0*)"]),
    (
        "volatile",
        "RenderStabilityFailure",
        [
            "*render stability: the prompt's token_ids differ between runs from position * "
            "(lengths * vs *): rendering the same request is not deterministic"
        ],
    ),
    ("stale_decode", "EquivalenceFailure", ["*equivalence: *", "*max_new_tokens=[12]*"]),
]


@pytest.mark.parametrize(("engine", "error", "lines"), BROKEN, ids=[b[0] for b in BROKEN])
@pytest.mark.slow
def test_broken_engine_fails_with_a_readable_message(
    pytester: pytest.Pytester, engine: str, error: str, lines: list[str]
) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, engine, "-k", "request_streams", examples=30)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"E   pytest_prefixcache.*.{error}: *"])
    result.stdout.fnmatch_lines(lines)
    result.stdout.fnmatch_lines(["failures by check: *: 1", f"  replay: {REPLAY_LINE}"])
    assert run_file(pytester.path)["flags"][1] == f"--prefixcache-engine=fakeengines:{engine}"


def test_top_logprobs_engine_is_compared_exactly(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "top_only", "-k", "request_streams")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["worst |cached - uncached|: 0"])
    requests = re.search(r"^requests run: (\d+) ", result.stdout.str(), re.M)
    assert requests is not None and int(requests[1]) > 0
    n = requests[1]
    result.stdout.re_match_lines([rf"  equivalence +{n}/{n}$"])  # compared on every request


@pytest.mark.parametrize(
    ("engine", "lines"),
    [
        # a 1e-6 shift of the cached logits moves the logprobs by ~3e-8: exact mode sees it
        (
            "top_only_drift",
            ["equivalence: logits differ beyond the tolerance (exact) *", "*|diff| *e-0*)"],
        ),
        # a cache that ignores image digests answers for another image
        ("top_only_ignore_digest", ["equivalence: step 0: top tokens differ: only cached *"]),
    ],
)
@pytest.mark.slow
def test_top_logprobs_engine_with_a_cache_bug_fails(
    pytester: pytest.Pytester, engine: str, lines: list[str]
) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, engine, "-k", "request_streams", examples=30)
    result.assert_outcomes(failed=1)
    head, *rest = lines
    result.stdout.fnmatch_lines(
        [f"E   pytest_prefixcache.errors.EquivalenceFailure: {head}", *rest]
    )


def test_nothing_runs_when_the_engine_cannot_be_built(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "not_an_engine", "-k", "request_streams")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*EngineError: engine 'fakeengines:not_an_engine' is a object: expected an object "
            "with run() and reset(), or a zero-argument callable returning one*"
        ]
    )


def test_volatile_header_bytes_are_a_finding_by_default(pytester: pytest.Pytester) -> None:
    """A correct cache that keeps a volatile header line reuses less: an efficiency finding,
    reported everywhere, not a failure (two correct third-party engines failed on it)."""
    with_fakes(pytester)
    result = run_suite(pytester, "keep_volatile", "-k", "corpus")
    result.assert_outcomes(passed=5)
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "efficiency findings (not failures; see the README's tiers): render hygiene: 2",
            "  render hygiene: request 1: request 1's prompt should equal request 0's *",
            "verdict: PASS",
        ]
    )


def test_corpus_catches_volatile_header_bytes_when_strict(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "keep_volatile", "-k", "corpus", "--prefixcache-strict-render")
    result.assert_outcomes(failed=1, passed=4)
    result.stdout.fnmatch_lines(
        [
            "E   *RenderHygieneFailure: render hygiene: request 1's prompt should equal "
            "request 0's (* tokens) but shares only its first * tokens (now * tokens)",
            "*a volatile header line*",
        ]
    )


@pytest.mark.slow
def test_rerendered_history_is_a_finding_and_fails_when_strict(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    lenient = run_suite(pytester, "rerender_history", "-k", "request_streams", examples=30)
    lenient.assert_outcomes(passed=1)
    lenient.stdout.fnmatch_lines(
        ["efficiency findings (not failures; see the README's tiers): render hygiene: *"]
    )
    strict = run_suite(
        pytester, "rerender_history", "-k", "request_streams", "--prefixcache-strict-render",
        examples=30,
    )  # fmt: skip
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(
        [
            "E   pytest_prefixcache.errors.RenderHygieneFailure: render hygiene: an append-only "
            "next turn of request * shares only the first * of its * prompt tokens (now * tokens)",
            "*first different token at position *: 260 (was 270)",
            f"  replay: {REPLAY_LINE}",
        ]
    )
    assert "--prefixcache-strict-render" in run_file(pytester.path)["flags"]


@pytest.mark.slow
def test_an_engine_that_reports_only_logits_is_still_checked(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    ok = run_suite(pytester, "minimal", "-k", "request_streams", examples=30)
    ok.assert_outcomes(passed=1)
    ok.stdout.fnmatch_lines(["cache efficiency vs the token oracle: n/a (nothing was reusable)"])
    bad = run_suite(pytester, "minimal_ignore_digest", "-k", "request_streams", examples=30)
    bad.assert_outcomes(failed=1)
    bad.stdout.fnmatch_lines(["E   *EquivalenceFailure: equivalence: logits differ *"])
