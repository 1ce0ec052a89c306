"""Recording failures into the session report: every verification failure of a test (each
distinct one Hypothesis found) with its saved stream and replay command, and every other
failed test (an error, an isolation failure, a crashed xdist worker) as an "error" record, so
that the report, the terminal and the exit code tell one verdict."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import cast

import pytest

from ..errors import VerificationFailure
from ..output.report import MAX_MESSAGE, FailureRecord, Report
from ..output.streams import save_stream
from ..types import Request
from .slots import CONFIG_PARAM, slot_of

__all__ = [
    "ENGINE_ERROR",
    "FailedTests",
    "is_flaky",
    "record",
    "record_skip",
    "verification_failures",
]


def verification_failures(exc: BaseException | None) -> list[VerificationFailure]:
    """Every VerificationFailure in ``exc``: Hypothesis reports each distinct failure it found
    (an exception group), or wraps one it saw once in a FlakyFailure group."""
    if exc is None:
        return []
    if isinstance(exc, VerificationFailure):
        return [exc]
    return [f for inner in getattr(exc, "exceptions", ()) for f in verification_failures(inner)]


def is_flaky(raised: BaseException | None) -> bool:
    return type(raised).__name__ == "FlakyFailure"


def record(
    item: pytest.Item, report: pytest.TestReport, exc: VerificationFailure, *, flaky: bool
) -> None:
    """Save the failing stream and add the failure to the session report."""
    slot = slot_of(item)
    s = slot.settings
    path = exc.replay_path
    if path:
        try:
            save_stream(
                cast("tuple[Request, ...]", exc.stream),
                Path(path).parent,
                check=exc.check,
                **exc.meta,
                seed=s.seed,
            )
        except OSError as err:
            path = f"(could not save {path}: {err})"
    summary = str(exc).splitlines()[0] if str(exc) else exc.check
    if flaky:  # Hypothesis saw it fail once and pass on replay
        summary = f"flaky (FlakyFailure): {summary}"
    replay = slot.run.replay_command if slot.run is not None else s.replay_command
    command = replay(path) if path else None
    stream_dir = None if not exc.replay_path else str(Path(exc.replay_path).parent.resolve())
    slot.report.failures.append(
        FailureRecord(
            exc.check, item.nodeid, summary, command, str(exc)[:MAX_MESSAGE],
            stream_dir if path == exc.replay_path else None, exc.request_index,
        )
    )  # fmt: skip
    if command:
        report.sections.append(("prefixcache replay", command))


#: The user property of a test report whose setup failed because the engine could not be
#: built (its value: why). Under pytest-xdist every worker builds its own engine.
ENGINE_ERROR = "prefixcache_engine_error"


def record_skip(item: pytest.Item, report: pytest.TestReport) -> None:
    """Add a skipped verification test to the session report, with pytest's reason (a
    scenario the engine cannot run, the checks left after the engine died)."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    slot_of(item).report.skipped.append(f"{item.nodeid}: {reason}")


class FailedTests:
    """Remembers every failed test (on the controller, crashed xdist workers included): one
    without a recorded verification failure becomes an "error" record of the report, with its
    traceback. An engine that could not be built is one error: under pytest-xdist, the same
    error from another worker (or configuration's test) is reported as a skip."""

    def __init__(self) -> None:
        self.lines: dict[str, str] = {}
        self.texts: dict[str, str] = {}
        """nodeid -> the failure's full text (its traceback)."""
        self.configs: dict[str, str] = {}
        """nodeid -> the matrix configuration of the failed test."""
        self.when: dict[str, float] = {}
        """nodeid -> the ``time.monotonic()`` its failed report came in."""
        self._engine_errors: set[str] = set()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.failed:
            return
        props = dict(report.user_properties)
        name = props.get(CONFIG_PARAM)
        why = props.get(ENGINE_ERROR)
        if why is not None:
            key = str(name)  # one per configuration: the workers' messages differ (ports)
            if key in self._engine_errors:  # already shown once (another xdist worker)
                _as_skip(report, "the engine could not be built (the error above)")
                return
            self._engine_errors.add(key)
        if name is not None:
            self.configs[report.nodeid] = str(name)
        crash = getattr(report.longrepr, "reprcrash", None)
        text = getattr(crash, "message", None) or str(report.longrepr).strip()
        line = (text.splitlines() or [""])[-1 if crash is None else 0][:300]
        self.lines.setdefault(report.nodeid, f"{report.when}: {line}")
        self.when.setdefault(report.nodeid, time.monotonic())
        self.texts.setdefault(report.nodeid, report.longreprtext[:MAX_MESSAGE])

    def record_errors(self, session: Report, configs: Mapping[str, Report], start: float) -> None:
        """Every failed test without a recorded verification failure as an "error" record of
        its configuration's report (``configs``, by name) or the ``session``'s, its moment
        (seconds after ``start``) a candidate for the report's first failure."""
        recorded = {f.test for report in configs.values() for f in report.failures}
        recorded |= {f.test for f in session.failures}
        for nodeid, line in self.lines.items():
            if nodeid in recorded:
                continue
            name = self.configs.get(nodeid, "")
            into = configs[name] if name in configs else session
            into.failures.append(FailureRecord("error", nodeid, line, message=self.texts[nodeid]))
            into.mark_failure("error", self.when[nodeid] - start, counted=False)


def _as_skip(report: pytest.TestReport, reason: str) -> None:
    """Turn a failed setup report into a skip (before the terminal and JUnit see it)."""
    path, lineno, _ = report.location
    report.outcome = "skipped"
    report.longrepr = (str(path), (lineno or 0) + 1, f"Skipped: {reason.splitlines()[0][:200]}")
