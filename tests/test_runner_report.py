"""The engine worker (timeouts, one thread) and the report object."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest

from pytest_prefixcache.output.report import FailureRecord, Report
from pytest_prefixcache.verify.worker import CallTimedOut, EngineWorker


def test_worker_returns_values_and_errors_on_one_thread() -> None:
    w = EngineWorker()

    def name() -> str:
        return threading.current_thread().name

    names = {w.call(name, timeout=5, what="a").value, w.call(name, timeout=5, what="b").value}
    assert names == {"prefixcache-engine"}
    res = w.call(lambda: 1 / 0, timeout=5, what="div")
    assert isinstance(res.error, ZeroDivisionError) and "ZeroDivisionError" in res.traceback
    assert w.call(lambda: 7, timeout=5, what="after an error").value == 7


def test_close_keeps_one_idle_daemon_thread() -> None:
    """The idle worker stays (a daemon, so it cannot keep the process alive) and later calls
    still run on that one thread (see EngineWorker.close for why it is not stopped)."""
    import threading

    w = EngineWorker()
    first = w.call(threading.get_ident, timeout=5, what="x").value
    thread = w._thread
    w.close()
    assert thread is not None and thread.is_alive() and thread.daemon
    assert w.call(threading.get_ident, timeout=5, what="after close").value == first
    w.close()


def test_worker_times_out_and_stays_dead() -> None:
    """The call is interrupted: it raises while the engine is still hung (``release`` is set
    only afterwards), and the worker stays dead."""
    w = EngineWorker()
    release = threading.Event()
    with pytest.raises(CallTimedOut, match=r"hang did not answer within 0.2 s"):
        w.call(release.wait, timeout=0.2, what="hang")
    assert not release.is_set()
    assert w.dead == "hang did not answer within 0.2 s"
    with pytest.raises(CallTimedOut):
        w.call(lambda: 1, timeout=5, what="later")
    release.set()


def test_report_lines_and_json(tmp_path: Path) -> None:
    r = Report(seed=3, engine="m:e", requests=10, cache_hits=4, reused_tokens=30,
               oracle_tokens=40, merges_checked=5, streams=2)  # fmt: skip
    r.add_diff(0.5, "request 2")
    r.add_diff(0.1, "request 3")
    r.failures.append(FailureRecord("equivalence", "t::x", "equivalence: ...", "pytest ..."))
    lines = r.lines()
    assert lines[:5] == [
        "engine: m:e; tolerance: exact",
        "requests run: 10 in 2 stream(s), 4 with cache hits",
        "cache efficiency vs the token oracle: 75.0% (30 of 40 reusable tokens)",
        "worst |cached - uncached|: 0.5 (request 2)",
        "merges checked: 5",
    ]
    assert "failures by check: equivalence: 1" in lines
    assert lines[-2:] == ["reproduce with --prefixcache-seed=3", "verdict: FAIL"]
    r.add_diff(math.inf, "request 9")
    r.write_json(tmp_path / "sub" / "r.json")
    data = json.loads((tmp_path / "sub" / "r.json").read_text())
    assert data["efficiency"] == 0.75 and data["worst_diff"] == "inf"
    assert data["failures"][0]["replay"] == "pytest ..."
    assert data["verdict"] == "fail"


def test_efficiency_is_unknown_when_nothing_was_reusable() -> None:
    assert Report().efficiency is None
    assert "n/a (nothing was reusable)" in Report().lines()[2]
