"""The verdict is a claim about what was checked: coverage, PASS (partial), INCOMPLETE, and
the cold baseline's first test (an uncached run may not report reuse)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from plugin_support import run_suite, with_fakes

from pytest_prefixcache import Image, Message, Outcome, Request
from pytest_prefixcache.checks import coverage_of
from pytest_prefixcache.checks.coverage import APPLIED, NOT_DECLARED, missing
from pytest_prefixcache.output.report import Report

pytest_plugins = ["pytester"]

LOGITS = np.zeros(8, np.float32)


def request(images: int = 0) -> Request:
    parts: list[object] = ["look"]
    parts += [Image(np.full((16, 16, 3), i, np.uint8)) for i in range(images)]
    return Request(messages=(Message("user", tuple(parts)),), max_new_tokens=2)  # type: ignore[arg-type]


def full(**extra: object) -> Outcome:
    fields: dict[str, object] = dict(
        logits=LOGITS,
        tokens=(0, 0),
        step_logits=(LOGITS, LOGITS),
        token_ids=(1, 2, 3),
        cached_tokens=0,
        image_spans=(),
        merges=(),
    )
    fields.update(extra)
    return Outcome(**fields)  # type: ignore[arg-type]


def test_a_full_outcome_applies_every_check() -> None:
    got = dict(coverage_of(request(), full(), full(), has_usage=True))
    assert got.pop("claims") == got.pop("step alignment") == NOT_DECLARED  # not a gap
    assert set(got.values()) == {APPLIED}
    assert "shapes" not in got  # a text-only request does not concern it


def test_each_missing_field_names_the_checks_it_disables() -> None:
    got = dict(coverage_of(request(), full(token_ids=None), full(), has_usage=False))
    assert got["reuse bound"] == got["positive control"] == got["render stability"]
    assert got["reuse bound"] == "no token_ids"
    assert got["memory budget"] == "no cache_usage()"
    got = dict(coverage_of(request(), full(step_logits=()), full(), has_usage=True))
    assert got["equivalence at decode steps"] == "step_logits on one side only"
    got = dict(coverage_of(request(), full(cached_tokens=None), full(), has_usage=True))
    assert got["reuse bound"] == "no cached_tokens"


def test_an_image_request_needs_merges_and_spans() -> None:
    spans = ((1, 2, "d"),)
    got = dict(coverage_of(request(1), full(image_spans=spans), full(), has_usage=True))
    assert got["shapes"] == APPLIED and got["reuse bound"] == APPLIED
    got = dict(coverage_of(request(1), full(merges=None), full(), has_usage=True))
    assert got["shapes"] == "no merges"
    got = dict(coverage_of(request(1), full(image_spans=None), full(), has_usage=True))
    assert got["reuse bound"] == "no image_spans"


def test_the_verdict() -> None:
    report = Report(requests=3)
    report.count("reuse bound", APPLIED)
    report.count("memory budget", "no cache_usage()")  # not required: still a pass
    assert report.verdict == "pass" and missing(report.coverage) == {}
    report.count("reuse bound", "no token_ids")
    assert report.verdict == "incomplete"
    assert missing(report.coverage) == {"reuse bound": {"no token_ids": 1}}
    report.allow_partial = True
    assert report.verdict == "partial"
    assert report.verdict_lines()[0] == (
        "verdict: PASS (partial: not checked on every request: reuse bound)"
    )
    assert Report(requests=0).verdict == "incomplete"  # nothing verified is never a pass
    merged = Report.from_json(json.loads(json.dumps(report.to_json())))
    assert merged.coverage == report.coverage and merged.verdict == "partial"


def test_an_engine_without_token_ids_is_incomplete(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "minimal", "-k", "request_streams", examples=10)
    result.assert_outcomes(passed=1)  # no check failed ...
    assert result.ret == 1  # ... but the run is not a pass
    result.stdout.fnmatch_lines(
        [
            "coverage (requests each check ran on / that concern it):",
            "  reuse bound * 0/* (no token_ids: *)",
            "verdict: INCOMPLETE: not checked on every request: *reuse bound*; "
            "--prefixcache-allow-partial accepts that",
            "  reuse bound: * request(s) with no token_ids: return Outcome.token_ids *",
        ]
    )


def test_partial_coverage_passes_when_accepted(pytester: pytest.Pytester, tmp_path) -> None:
    with_fakes(pytester)
    report = tmp_path / "report.json"
    result = run_suite(
        pytester, "minimal", "-k", "request_streams", "--prefixcache-allow-partial",
        f"--prefixcache-report={report}", examples=10,
    )  # fmt: skip
    assert result.ret == 0
    result.stdout.fnmatch_lines(["verdict: PASS (partial: not checked on every request: *)"])
    data = json.loads(report.read_text())
    assert data["verdict"] == "partial" and data["allow_partial"] is True
    assert data["not_checked"]["reuse bound"] == {"no token_ids": data["requests"]}


def test_a_correct_engine_passes_with_full_coverage(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "good", "-k", "request_streams", examples=10)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["  shapes * */*", "verdict: PASS"])
    result.stdout.no_fnmatch_line("*INCOMPLETE*")


def test_an_uncached_run_that_reuses_is_a_fault(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "ignore_use_cache", "-k", "request_streams", examples=10)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["E   *EngineFault: fault: uncached run: use_cache=False reported cached_tokens=*"]
    )


def test_a_run_that_verified_nothing_is_not_a_pass(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    result = run_suite(pytester, "good", "-k", "test_mine", examples=1)
    result.assert_outcomes(passed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["verdict: INCOMPLETE: no request was verified"])


def test_one_finding_does_not_end_the_search(pytester: pytest.Pytester) -> None:
    """Image requests are never stored (the positive control fails first) and text hits
    drift: both failures are found, shrunk and recorded, each with its own saved stream."""
    with_fakes(pytester)
    result = run_suite(pytester, "two_bugs", "-k", "request_streams", examples=60)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["failures by check: equivalence: 1, positive control: 1"])
    saved = list((pytester.path / ".prefixcache" / "failures").glob("*/stream.json"))
    assert len(saved) == 2


def test_equivalence_that_compared_nothing_did_not_run() -> None:
    got = dict(coverage_of(request(), full(), full(), has_usage=True, compared=0))
    assert got["equivalence"] == "nothing compared"


def test_the_junit_file_carries_the_verdict_and_the_coverage(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "minimal", "-k", "request_streams", "--junitxml=j.xml")
    assert result.ret == 1
    junit = (pytester.path / "j.xml").read_text()
    assert '<property name="prefixcache_verdict" value="incomplete"' in junit
    assert '<property name="prefixcache_coverage: reuse bound" value="0/' in junit
