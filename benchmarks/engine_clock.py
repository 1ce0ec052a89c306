"""A pytest plugin for ``benchmarks/verify_throughput.py --cost``: the time spent inside the
reference engine's ``run`` (render, prefill, decode), wherever the engine runs.

In-process, ``reference_engine.engine.Engine.run`` is timed (every instance: the engine under
test and the audit's fresh ones). Over HTTP, the reference server times the same call and
says so in each reply's ``Server-Timing: engine;dur=MS`` header; the adapter's ``http_json``
is wrapped to add those up (every server: cached, cold and the audit's fresh ones). At the end
of the session the totals go to the JSON file named by ``$PREFIXCACHE_ENGINE_CLOCK``.

The plugin imports the reference engine, its server and the HTTP presets on every path, so the
three paths load the same local modules: Hypothesis draws constants from them, and the same
modules make the same streams.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pytest

import pytest_prefixcache.adapters.http.openai as openai_adapter
import pytest_prefixcache.adapters.presets  # noqa: F401  (the same modules on every path)
import reference_engine.server  # noqa: F401
from reference_engine.engine import Engine

TOTALS: dict[str, float] = {"engine_s": 0.0, "in_process_runs": 0, "server_timed_replies": 0}
_lock = threading.Lock()


def _add(key: str, seconds: float) -> None:
    with _lock:
        TOTALS["engine_s"] += seconds
        TOTALS[key] += 1


def _server_timing(value: str) -> float | None:
    """Seconds of the ``engine`` metric in a Server-Timing header, if any."""
    for metric in value.split(","):
        name, *params = (p.strip() for p in metric.split(";"))
        if name == "engine":
            for p in params:
                if p.startswith("dur="):
                    return float(p[4:]) / 1000
    return None


def pytest_configure(config: pytest.Config) -> None:
    run, http_json = Engine.run, openai_adapter.http_json

    def timed_run(self: Engine, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return run(self, *args, **kwargs)
        finally:
            _add("in_process_runs", time.perf_counter() - start)

    def timed_http_json(*args: Any, response_headers: Any = None, **kwargs: Any) -> Any:
        headers: dict[str, str] = {}
        out = http_json(*args, response_headers=headers, **kwargs)
        if response_headers is not None:
            response_headers.update(headers)
        seconds = _server_timing(headers.get("server-timing", ""))
        if seconds is not None:
            _add("server_timed_replies", seconds)
        return out

    Engine.run = timed_run  # type: ignore[method-assign]
    openai_adapter.http_json = timed_http_json  # type: ignore[assignment]


def pytest_unconfigure(config: pytest.Config) -> None:
    path = os.environ.get("PREFIXCACHE_ENGINE_CLOCK")
    if path:
        with open(path, "w") as f:
            json.dump(TOTALS, f)
