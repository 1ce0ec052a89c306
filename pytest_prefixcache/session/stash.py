"""Per-session state kept in ``config.stash``: the settings, the report, the engine worker."""

from __future__ import annotations

import pytest

from ..output.report import Report
from ..verify.worker import EngineWorker
from .progress import Progress
from .settings import Settings

__all__ = [
    "DATABASE_KEY",
    "PROGRESS_KEY",
    "REPORT_KEY",
    "SETTINGS_KEY",
    "START_KEY",
    "WORKER_KEY",
    "report_of",
    "settings_of",
    "worker_of",
]

SETTINGS_KEY = pytest.StashKey[Settings]()
REPORT_KEY = pytest.StashKey[Report]()
WORKER_KEY = pytest.StashKey[EngineWorker]()
PROGRESS_KEY = pytest.StashKey[Progress]()
DATABASE_KEY = pytest.StashKey[object]()
START_KEY = pytest.StashKey[float]()


def settings_of(config: pytest.Config) -> Settings:
    return config.stash.get(SETTINGS_KEY, Settings(invocation_dir=config.invocation_params.dir))


def report_of(config: pytest.Config) -> Report:
    return config.stash.setdefault(REPORT_KEY, Report())


def worker_of(config: pytest.Config) -> EngineWorker:
    return config.stash.setdefault(WORKER_KEY, EngineWorker())
