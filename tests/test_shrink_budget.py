"""``--prefixcache-shrink-budget``: a failing property runs at most ``limit`` examples on the
engine after its first failure, and its failure is still reported, shrunk (counted in
examples, never in seconds: :mod:`pytest_prefixcache.verify.shrink_budget`).

Each bound has its negative control: the same run without a budget spends more than the
budget would have allowed, so the budget is what stopped it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from pytest_prefixcache.output.report import Report
from pytest_prefixcache.session.values import shrink_budget
from pytest_prefixcache.verify.shrink_budget import ShrinkBudget, limit_for


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        report_multiple_bugs=True,
        print_blob=False,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )


def _sums(limit: int | None) -> tuple[ShrinkBudget, list[list[int]], BaseException]:
    """A property that fails when a list sums above 300: every call that reaches the
    "engine" is recorded."""
    budget = ShrinkBudget(limit, Report())
    ran: list[list[int]] = []

    @seed(3)
    @_settings(100)
    @given(xs=st.lists(st.integers(0, 100), min_size=1, max_size=20))
    @budget.bounds
    def prop(xs: list[int]) -> None:
        ran.append(xs)
        assert sum(xs) <= 300, f"sum {sum(xs)} of {xs}"

    with pytest.raises(AssertionError) as info:
        prop()
    return budget, ran, info.value


def _after_first_failure(ran: list[list[int]]) -> int:
    first = next(i for i, xs in enumerate(ran) if sum(xs) > 300)
    return len(ran) - first - 1


def test_a_failing_property_runs_at_most_the_budget_after_its_first_failure() -> None:
    budget, ran, error = _sums(5)
    assert _after_first_failure(ran) <= 5
    assert budget.spent == _after_first_failure(ran) == budget.report.shrink_examples  # type: ignore[union-attr]
    assert budget.skipped > 0 and budget.report.shrink_skipped == budget.skipped  # type: ignore[union-attr]
    # the failure is still reported: a failing input that ran (the smallest Hypothesis saw),
    # raised again on its final replay without reaching the engine
    assert budget.replayed >= 1
    failing = [xs for xs in ran if sum(xs) > 300]
    reported = next(xs for xs in failing if str(error).startswith(f"sum {sum(xs)} of {xs}\n"))
    assert len(reported) <= len(failing[0])


def test_without_a_budget_the_same_failure_runs_more() -> None:
    """Negative control: Hypothesis alone shrinks this one with far more calls."""
    budget, ran, error = _sums(None)
    assert _after_first_failure(ran) > 5
    assert budget.skipped == 0 and budget.replayed == 0
    assert "sum 301" in str(error)  # shrunk all the way


def test_budget_zero_reports_the_first_failure_unshrunk() -> None:
    budget, ran, error = _sums(0)
    assert _after_first_failure(ran) == 0
    first = next(xs for xs in ran if sum(xs) > 300)
    assert str(error).startswith(f"sum {sum(first)} of {first}\n") and budget.replayed >= 1


def test_the_limit_is_a_share_of_the_property_examples() -> None:
    assert limit_for(1.0, 100) == 100
    assert limit_for(0.5, 5) == 3
    assert limit_for(0.0, 100) == 0
    assert limit_for(None, 100) is None


@pytest.mark.parametrize("bad", ["-1", "x", "inf", "nan", ""])
def test_a_bad_budget_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=repr(bad).replace("'", ".")):
        shrink_budget(bad)
    assert shrink_budget("none") is None and shrink_budget("0.5") == 0.5


def test_the_summary_and_the_json_report_count_what_the_budget_did() -> None:
    from pytest_prefixcache.output.records import FailureRecord
    from pytest_prefixcache.output.summary import summarize

    report = Report()
    report.failures.append(FailureRecord("equivalence", "t::test_request_streams", "x", "r"))
    assert not [ln for ln in summarize(report).failures if ln.key == "shrinking"]
    report.shrink_examples, report.shrink_skipped = 7, 30
    (line,) = [ln for ln in summarize(report).failures if ln.key == "shrinking"]
    assert "7 example(s) run" in line.text and "30 skipped" in line.text
    back = Report.from_json(report.to_json())
    assert (back.shrink_examples, back.shrink_skipped) == (7, 30)


mx = pytest.importorskip("mlx.core")

from pytest_prefixcache.errors import EquivalenceFailure  # noqa: E402
from pytest_prefixcache.stateful import machine_for  # noqa: E402
from pytest_prefixcache.strategies import request_streams  # noqa: E402
from pytest_prefixcache.types import Request  # noqa: E402
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions  # noqa: E402
from reference_engine.mutants import MUTANTS  # noqa: E402

MUTANT = "placeholder_collision"
LIMIT = 3


def _verifier(models: Any, tmp_path: Path) -> Verifier:
    mutant = MUTANTS[MUTANT]
    options = VerifyOptions(failures_dir=tmp_path, timeout=600.0)
    return Verifier(mutant.build(models(mutant.model)), options=options)


def _mutant_streams(models: Any, tmp_path: Path, limit: int | None) -> tuple[Any, ...]:
    verifier = _verifier(models, tmp_path)
    budget = ShrinkBudget(limit, verifier.report)
    failing: list[int] = []

    @seed(0)
    @_settings(20)
    @given(stream=request_streams())
    @budget.bounds
    def prop(stream: tuple[Request, ...]) -> None:
        try:
            verifier.run(stream)
        except EquivalenceFailure:
            failing.append(len(stream))
            raise

    with pytest.raises(EquivalenceFailure) as info:
        prop()
    return budget, failing, info.value, verifier.report


def test_a_mutant_stays_caught_and_shrunk_within_the_budget(models: Any, tmp_path: Path) -> None:
    budget, failing, error, report = _mutant_streams(models, tmp_path, LIMIT)
    assert report.shrink_examples == budget.spent <= LIMIT
    assert budget.replayed >= 1 and budget.skipped > 0
    assert len(error.stream) <= failing[0]  # the reported stream is no longer than the first
    assert error.replay_path and "--prefixcache-replay" in str(error)


def test_a_mutant_without_a_budget_runs_more_examples(models: Any, tmp_path: Path) -> None:
    """Negative control: the same seed, unbounded, runs more than LIMIT after its failure."""
    budget, _, error, report = _mutant_streams(models, tmp_path, None)
    assert report.shrink_examples == budget.spent > LIMIT
    assert isinstance(error, EquivalenceFailure)


def test_the_state_machine_follows_the_failed_runs_past_the_budget(
    models: Any, tmp_path: Path
) -> None:
    """Past the budget a machine never reaches the engine: it follows a failed run's steps (as
    they were sent) and raises its failure again on Hypothesis's final replay, without a
    flaky-data error."""
    verifier = _verifier(models, tmp_path)
    budget = ShrinkBudget(LIMIT, verifier.report)
    machine = seed(1)(machine_for(verifier, budget=budget))
    with pytest.raises(EquivalenceFailure) as info:
        run_state_machine_as_test(machine, settings=settings(_settings(20), stateful_step_count=8))
    assert verifier.report.shrink_examples == budget.spent <= LIMIT
    assert budget.replayed >= 1 and budget.skipped > 0
    assert info.value.stream and len(info.value.stream) <= 8
