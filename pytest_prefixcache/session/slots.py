"""One slot per engine configuration: its settings, report, engine worker and engine.

A plain run has one slot, which is the session's own settings, report and worker (so nothing
about it changes). A matrix run (several configurations, or a matrix file) has one slot per
configuration: the suite's tests are parametrized by ``prefixcache_config`` (the slot's name),
ordered by it, and the session report is assembled from the slots at the end: their counters
summed and one row each (``Report.configs``), the verdict the worst row's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pytest

from ..output.report import Report
from ..types import Engine
from ..verify.audit import Audit
from ..verify.worker import EngineWorker
from .run_record import RunRecord
from .settings import Settings
from .stash import report_of, settings_of, worker_of
from .targets import Target

__all__ = [
    "CONFIG_PARAM",
    "SLOTS_KEY",
    "Slot",
    "assemble",
    "is_matrix",
    "name_of",
    "slot_of",
    "slots_of",
]

#: The parameter (and fixture) the suite's tests are parametrized by in a matrix run.
CONFIG_PARAM = "prefixcache_config"


@dataclass
class Slot:
    """One configuration's state in this process."""

    name: str
    settings: Settings
    report: Report
    worker: EngineWorker
    target: Target | None = None
    """None: the single configuration of a plain run."""
    built: tuple[Engine, Audit] | None = None
    used: bool = False
    """Some test of this configuration ran here (an xdist worker sends only these)."""
    run: RunRecord | None = None
    """Its run file and replay commands, once its verifier is built."""

    @contextmanager
    def environment(self) -> Iterator[None]:
        """The configuration's environment, restored afterwards."""
        env = {} if self.target is None else self.target.environment()
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


SLOTS_KEY = pytest.StashKey[dict[str, Slot]]()


def _settings(base: Settings, t: Target) -> Settings:
    o = t.overrides
    return replace(
        base,
        engine=t.engine,
        engine_source=t.source,
        server_cmd=t.command,
        server_body=o.get("server_body"),
        model=o.get("model", base.model),
        model_source="matrix" if "model" in o else base.model_source,
        examples=o.get("examples", base.examples),
        timeout=o.get("timeout", base.timeout),
        atol=o.get("atol", base.atol),
        rtol=o.get("rtol", base.rtol),
        kl=o.get("kl", base.kl),
        matrix=t.matrix,
        config_name=t.name,
    )


def make_slots(config: pytest.Config, targets: list[Target] | None) -> None:
    """The slots of this session: one per target, or the plain run's one (``targets`` None)."""
    base = settings_of(config)
    if targets is None:
        one = Slot("", base, report_of(config), worker_of(config))
        config.stash[SLOTS_KEY] = {"": one}
        return
    slots = {}
    for t in targets:
        s = _settings(base, t)
        rep = Report(seed=s.seed, engine=t.describe(), model=s.model, shards=s.shards)
        rep.parallel_streams = s.parallel_streams
        rep.tolerance = _tolerance(s)
        rep.allow_partial = s.allow_partial
        slots[t.name] = Slot(t.name, s, rep, EngineWorker(f"prefixcache-{t.name}"), t)
    config.stash[SLOTS_KEY] = slots
    report_of(config).engine = f"{len(slots)} configurations: {', '.join(slots)}"


def _tolerance(s: Settings) -> str:
    from ..checks.equivalence import Tolerance

    return Tolerance(s.atol, s.rtol, s.kl).describe()


def slots_of(config: pytest.Config) -> dict[str, Slot]:
    if SLOTS_KEY not in config.stash:
        make_slots(config, None)
    return config.stash[SLOTS_KEY]


def is_matrix(config: pytest.Config) -> bool:
    return "" not in slots_of(config)


def name_of(item: pytest.Item) -> str:
    """The configuration an item runs (``""`` in a plain run or for a test that uses none)."""
    callspec = getattr(item, "callspec", None)
    params: dict[str, Any] = getattr(callspec, "params", {})
    return str(params.get(CONFIG_PARAM, ""))


def slot_of(item: pytest.Item) -> Slot:
    slots = slots_of(item.config)
    return slots.get(name_of(item)) or next(iter(slots.values()))


def row(slot: Slot) -> dict[str, Any]:
    """A configuration's row of the session report."""
    rep = slot.report
    data = rep.to_json()
    for key in ("format", "records", "seed", "shards", "parallel_streams"):
        data.pop(key, None)
    verdict = "error" if rep.engine_error else rep.verdict
    return {"name": slot.name, **data, "verdict": verdict}


def assemble(config: pytest.Config) -> None:
    """The session report of a matrix run: every configuration's counters, failures and
    records summed, and one row per configuration (which sets the verdict)."""
    slots = slots_of(config)
    rep = report_of(config)
    rep.engine = f"{len(slots)} configurations: {', '.join(slots)}"
    rep.tolerance = "per configuration"
    for name, slot in slots.items():
        error, slot.report.engine_error = slot.report.engine_error, ""
        rep.merge(slot.report)
        slot.report.engine_error = error
        if error and not rep.engine_error:
            rep.engine_error = f"{name}: {error}"
    rep.tolerance = "per configuration"
    rep.run, rep.run_file = {}, ""  # each configuration's row carries its own
    rep.configs = [row(slot) for slot in slots.values()]
    seen = {r.worker for r in rep.records} | {f.worker for f in rep.failures}
    if rep.workers:  # xdist workers, not (configuration, worker) pairs
        rep.workers = len(seen - {""}) or rep.workers


def order_by_config(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A matrix run's items, one configuration after another (so one engine is up at a
    time), each tagged with its configuration (a property of its reports)."""
    order = {name: i for i, name in enumerate(slots_of(config))}
    items.sort(key=lambda item: order.get(name_of(item), -1))
    for item in items:
        name = name_of(item)
        if name:
            item.user_properties.append((CONFIG_PARAM, name))


def matrix_header(config: pytest.Config) -> list[str]:
    """The header's lines for a matrix run: one per configuration."""
    if not is_matrix(config):
        return []
    out = [f"prefixcache: {len(slots_of(config))} engine configurations, one after another:"]
    for name, slot in slots_of(config).items():
        s = slot.settings
        model = f"model {s.model} ({s.model_source}); " if s.model is not None else ""
        out.append(
            f"prefixcache: configuration {name}: {slot.report.engine}; {model}{s.examples} "
            f"examples, tolerance {slot.report.tolerance}, timeout {s.timeout:g} s"
        )
    return out
