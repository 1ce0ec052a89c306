"""One verdict: every failed test is a record of report.json (its check, or "error"), and the
terminal, the JSON report and the exit code agree."""

from __future__ import annotations

import json

import pytest
from plugin_support import run_suite, with_fakes

pytest_plugins = ["pytester"]


def test_a_failed_test_without_a_stream_is_an_error_record(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makepyfile(test_mine="def test_mine():\n    assert 1 == 2, 'my own check'\n")
    result = run_suite(
        pytester, "good", "-k", "request_streams or test_mine", "--prefixcache-report=r.json",
        examples=3,
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["failures by check: error: 1", "verdict: FAIL"])
    data = json.loads((pytester.path / "r.json").read_text())
    (failure,) = data["failures"]
    assert data["verdict"] == "fail" and failure["check"] == "error"
    assert failure["test"] == "test_mine.py::test_mine"
    assert failure["summary"].startswith("call: AssertionError: my own check")


@pytest.mark.slow
def test_a_crashed_xdist_worker_is_recorded(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    with_fakes(pytester)
    pytester.makepyfile(test_crash="import os\n\n\ndef test_crash():\n    os._exit(3)\n")
    result = run_suite(
        pytester, "good", "-k", "request_streams or test_crash", "--prefixcache-report=r.json",
        "-n", "1", examples=3, subprocess=True,
    )  # fmt: skip
    assert result.ret == 1
    data = json.loads((pytester.path / "r.json").read_text())
    crashed = [f for f in data["failures"] if f["test"].endswith("test_crash")]
    assert [f["check"] for f in crashed] == ["error"], data["failures"]
    assert data["verdict"] == "fail"
    result.stdout.fnmatch_lines(["verdict: FAIL"])
