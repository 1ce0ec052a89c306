"""``--prefixcache-shrink-budget`` end to end: a failing run stays within the budget, counted in
its report, and still reports every failing test with its replay line; without a budget the same
run spends more (the negative control); a bad value is a usage error naming it."""

from __future__ import annotations

import json
import math

import pytest
from plugin_support import REPLAY_LINE, run_suite, with_fakes

pytest_plugins = ["pytester"]

EXAMPLES = 10
SHARE = 0.5
#: The streams run EXAMPLES examples, the state machine half as many (the waves are skipped:
#: the fake engine declares no concurrency).
BOUND = math.ceil(SHARE * EXAMPLES) + math.ceil(SHARE * EXAMPLES / 2)


def _run(pytester: pytest.Pytester, budget: str) -> tuple[pytest.RunResult, dict[str, object]]:
    with_fakes(pytester)
    report = pytester.path / "report.json"
    result = run_suite(
        pytester,
        "ignore_digest",
        "-k",
        "request_streams or state_machine",
        f"--prefixcache-shrink-budget={budget}",
        f"--prefixcache-report={report}",
        examples=EXAMPLES,
    )
    return result, json.loads(report.read_text())


def test_a_failing_run_stays_within_the_budget_and_reports_every_failure(
    pytester: pytest.Pytester,
) -> None:
    result, report = _run(pytester, str(SHARE))
    result.assert_outcomes(failed=2)
    assert 0 < report["shrink_examples"] <= BOUND  # type: ignore[operator]
    failures = report["failures"]
    assert isinstance(failures, list) and len(failures) == 2
    assert all(f["replay"] and f["stream_dir"] for f in failures)
    result.stdout.fnmatch_lines(
        [f"  replay: {REPLAY_LINE}", "after a first failure: * example(s) run (shrinking, *"]
    )


@pytest.mark.slow
def test_without_a_budget_the_same_run_spends_more(pytester: pytest.Pytester) -> None:
    """Negative control: the budget is what bounded the run above."""
    result, report = _run(pytester, "none")
    result.assert_outcomes(failed=2)
    assert report["shrink_examples"] > BOUND  # type: ignore[operator]
    assert report["shrink_skipped"] == 0


def test_a_bad_budget_is_a_usage_error_naming_it(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "good", "--prefixcache-shrink-budget=-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    says = "'-1' is not a number >= 0 or 'none'"
    result.stderr.fnmatch_lines([f"*--prefixcache-shrink-budget*{says}*"])
