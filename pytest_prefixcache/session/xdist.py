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
from .slots import is_matrix, slots_of
from .stash import report_of, settings_of

__all__ = ["Controller", "is_worker", "send_report", "worker_count", "worker_input"]

REPORT = "prefixcache_report"
SEED = "prefixcache_seed"
PROGRESS = "prefixcache_progress"
CONFIGS = "prefixcache_configs"


def config_in(nodeid: str, names: list[str]) -> str | None:
    """The configuration a test id names (its parameter id is the configuration's name, or
    has it as a ``-``-joined part), the longest of ``names`` that fits; None if none does."""
    test = nodeid.rsplit("::", 1)[-1]
    if "[" not in test or not test.endswith("]"):
        return None
    param = test[test.index("[") + 1 : -1]
    for name in names:  # longest first: "good-2" before "good"
        if param == name or param.startswith(f"{name}-") or param.endswith(f"-{name}"):
            return name
        if f"-{name}-" in param:
            return name
    return None


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
    """On a worker: hand this worker's report (in a matrix run: the report of each
    configuration it ran) to the controller."""
    if not is_worker(config):
        return
    if is_matrix(config):
        out = {n: s.report.to_json() for n, s in slots_of(config).items() if s.used}
        config.workeroutput[CONFIGS] = out  # type: ignore[attr-defined]
    else:
        config.workeroutput[REPORT] = report_of(config).to_json()  # type: ignore[attr-defined]


def attach_progress(config: pytest.Config, report: pytest.TestReport) -> None:
    """On a worker: the counters so far ride along with each suite test's report."""
    if is_worker(config):
        total: dict[str, int] = {}
        for slot in slots_of(config).values():
            for k, v in counts(slot.report).items():
                total[k] = total.get(k, 0) + v
        report.user_properties.append((PROGRESS, total))


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
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """A matrix run under ``--dist load`` (what ``-n`` means): each configuration is one
        unit of work, so one worker runs all of its tests with one engine."""
        if not is_matrix(config) or config.getvalue("dist") != "load":
            return None
        from xdist.scheduler import LoadScopeScheduling

        names = sorted(slots_of(config), key=len, reverse=True)

        class ByConfiguration(LoadScopeScheduling):  # type: ignore[misc]
            def _split_scope(self, nodeid: str) -> str:
                return config_in(nodeid, names) or str(super()._split_scope(nodeid))

        return ByConfiguration(config, log)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        output = getattr(node, "workeroutput", {})
        data = output.get(REPORT)
        if data:
            report_of(self.config).merge(Report.from_json(data), worker=node.gateway.id)
        slots = slots_of(self.config)
        for name, one in output.get(CONFIGS, {}).items():
            if name in slots:
                slots[name].report.merge(Report.from_json(one), worker=node.gateway.id)

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
