"""pytest-xdist support: every worker builds its own engine and runs its own shards (seeds
derived from the controller's seed); the controller merges the workers' reports and prints
their progress.

Workers send :meth:`Report.to_json` in ``config.workeroutput`` (syrupy's pattern) and attach a
progress snapshot to each test report's ``user_properties``.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..output.report import Report
from .progress import Progress, counts
from .stash import report_of, settings_of

__all__ = ["Controller", "is_worker", "send_report", "worker_count", "worker_input"]

REPORT = "prefixcache_report"
SEED = "prefixcache_seed"
PROGRESS = "prefixcache_progress"


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def worker_input(config: pytest.Config) -> dict[str, Any]:
    return dict(getattr(config, "workerinput", {}))


def worker_count(config: pytest.Config) -> int:
    """The number of xdist workers this session runs on (1 when it is not distributed)."""
    if is_worker(config):
        return int(worker_input(config).get("workercount", 1))
    n = getattr(config.option, "numprocesses", None)
    if isinstance(n, int) and n > 0 and getattr(config.option, "dist", "no") != "no":
        return n
    return 1


def send_report(config: pytest.Config) -> None:
    """On a worker: hand this worker's report to the controller."""
    if is_worker(config):
        config.workeroutput[REPORT] = report_of(config).to_json()  # type: ignore[attr-defined]


def attach_progress(config: pytest.Config, report: pytest.TestReport) -> None:
    """On a worker: the counters so far ride along with each suite test's report."""
    if is_worker(config):
        report.user_properties.append((PROGRESS, counts(report_of(config))))


class Controller:
    """Hooks registered on the xdist controller only."""

    def __init__(self, config: pytest.Config, progress: Progress) -> None:
        self.config = config
        self.progress = progress
        self.latest: dict[str, dict[str, int]] = {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[SEED] = settings_of(self.config).seed

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        data = getattr(node, "workeroutput", {}).get(REPORT)
        if data:
            report_of(self.config).merge(Report.from_json(data), worker=node.gateway.id)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        snap = dict(report.user_properties).get(PROGRESS)
        node = getattr(report, "node", None)
        if not isinstance(snap, dict) or node is None:
            return
        self.latest[node.gateway.id] = {str(k): int(v) for k, v in snap.items()}
        total: dict[str, int] = {}
        for one in self.latest.values():
            for k, v in one.items():
                total[k] = total.get(k, 0) + v
        self.progress.show(total, workers=len(self.latest))
