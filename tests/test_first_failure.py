"""The moment of the first failure: every kind of failure (a check's problem, a timeout as it
fires, a corpus scenario's failure, a test's error) stamps the report with the seconds since the
session's start, so a run that ends at its first failure still says when that was. Before, the
only clock was the progress line, which never counts a failure that ends its test before the
next request (a timeout, the last scenario of a run): the controls show that gap."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from plugin_engines import FakeEngine
from plugin_support import run_suite, with_fakes

from pytest_prefixcache import Message, Request
from pytest_prefixcache.errors import VerificationFailure
from pytest_prefixcache.output.report import Report
from pytest_prefixcache.output.report_data import ReportData
from pytest_prefixcache.session.progress import Progress
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions

pytest_plugins = ["pytester"]

TIMEOUT = 2.0  # the fake engine answers in milliseconds: only the hung call reaches it


class HangsOn(FakeEngine):
    """A correct engine whose every call for a request ending with the user text ``text``
    hangs until the test releases it."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.release = threading.Event()
        self.hung_at: float | None = None

    def run(self, request: Request, *, use_cache: bool) -> Any:
        if request.messages[-1].content == (self.text,):
            self.hung_at = self.hung_at or time.monotonic()
            self.release.wait()
        return super().run(request, use_cache=use_cache)


def _stream() -> list[Request]:
    system = Message("system", ("You are a careful assistant. " * 4,))
    return [
        Request((system, Message("user", ("What is a prefix cache?",)))),
        Request((system, Message("user", ("And a block table?",)))),
    ]


@pytest.mark.timing
def test_a_timeout_stamps_the_moment_it_fired_where_no_progress_line_counts_it(
    tmp_path: Path,
) -> None:
    engine = HangsOn("And a block table?")  # request 1: request 0 ran and was checked
    started = time.monotonic()
    options = VerifyOptions(failures_dir=tmp_path, timeout=TIMEOUT, started=started)
    lines: list[str] = []
    progress = Progress(1e-9, lines.append)  # a line before every request
    verifier = Verifier(engine, options=options, on_step=progress.on_step)
    try:
        with pytest.raises(VerificationFailure, match="did not answer within 2 s"):
            verifier.run(_stream())
    finally:
        engine.release.set()
    first = verifier.report.first_failure
    assert first is not None and first.check == "timeout"
    assert (first.streams, first.requests) == (1, 1)  # request 0 done, request 1 hung
    assert engine.hung_at is not None
    # it fired no earlier than the timeout after the call hung (lower bounds only)
    assert first.seconds >= round(engine.hung_at - started + TIMEOUT, 1) - 0.1
    # the control: the old clock, the progress lines, never counted this failure
    assert lines and all(", 0 failed test(s)" in line for line in lines)
    assert "shrinking" not in " ".join(lines)


def test_the_first_of_several_failures_is_kept_and_travels_in_the_json() -> None:
    one, two = ReportData(streams=3, requests=9), ReportData(streams=1, requests=2)
    one.mark_failure("timeout", 61.26)
    one.mark_failure("equivalence", 70.0)  # later: not the first
    two.mark_failure("error", 12.0, counted=False)
    assert one.first_failure is not None
    assert (one.first_failure.check, one.first_failure.seconds) == ("timeout", 61.3)
    assert (one.first_failure.streams, one.first_failure.requests) == (3, 9)
    merged = Report()
    merged.merge(one, worker="gw0")
    assert merged.first_failure == one.first_failure
    merged.merge(two, worker="gw1")  # an earlier failure on another worker wins
    assert merged.first_failure == two.first_failure
    assert merged.first_failure is not None and merged.first_failure.streams is None
    back = Report.from_json(json.loads(json.dumps(merged.to_json())))
    assert back.first_failure == merged.first_failure
    assert Report.from_json(json.loads(json.dumps(Report().to_json()))).first_failure is None


def _report(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def test_a_failing_corpus_scenario_is_stamped_and_a_passing_run_is_not(
    pytester: pytest.Pytester,
) -> None:
    with_fakes(pytester)
    failed = run_suite(pytester, "drift", "-k", "test_corpus", "-x", "--prefixcache-report=f.json")
    assert failed.ret == pytest.ExitCode.TESTS_FAILED
    data = _report(pytester.path / "f.json")
    first = data["first_failure"]
    assert first["check"] == data["failures"][0]["check"] == "equivalence"
    assert "test_corpus[" in data["failures"][0]["test"]
    assert first["seconds"] >= 0 and first["streams"] >= 1 and first["requests"] >= 1
    failed.stdout.fnmatch_lines(
        ["first failure: equivalence, * s after the session's start, after * stream(s) and *"]
    )
    # the control: the same scenarios on a correct engine pass, and nothing is stamped
    passed = run_suite(pytester, "good", "-k", "test_corpus", "--prefixcache-report=p.json")
    assert passed.ret == pytest.ExitCode.OK
    clean = _report(pytester.path / "p.json")
    assert clean["first_failure"] is None and clean["requests"] > 0
    assert clean["slowest_call"] > 0  # every call's answer was timed
    assert "first failure:" not in passed.stdout.str()


def test_a_test_error_is_stamped_as_an_error(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makepyfile(
        test_mine="def test_broken(prefixcache_verify):\n    raise RuntimeError('boom')\n"
    )
    result = run_suite(pytester, "good", "test_mine.py", "--prefixcache-report=r.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    data = _report(pytester.path / "r.json")
    errors = [f for f in data["failures"] if f["check"] == "error"]
    assert errors and "test_broken" in errors[0]["test"]
    first = data["first_failure"]
    assert first["check"] == "error" and first["seconds"] >= 0
    assert first["streams"] is None and first["requests"] is None  # a test's, not a stream's
