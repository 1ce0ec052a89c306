"""A pytest plugin for ``benchmarks/families_verify.py``: what a verification run drove.

It counts the stream-path runs (``Verifier.run``, one per generated or corpus stream), those of
them that sent the engine's replies back (a request carries a reply marker: a closed-loop
stream without an ``append`` move carries none), and the waves property's waves
and the requests in them (``Verifier.run_waves``); the state machine's streams are counted by
the report (its ``streams`` counter), not here. At the end of the session each process writes
its counts to the JSON file ``$PREFIXCACHE_VERIFY_COUNTS.<worker>`` (``.main`` without
pytest-xdist). Wrapping two methods costs nothing the run would notice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported in pytest_configure: the plugin's modules load after pytest
    # has marked them for assertion rewriting (a -p plugin is imported before that)
    from pytest_prefixcache.types import Request, Wave

COUNTS: dict[str, int] = {
    "stream_runs": 0,
    "closed_loop_streams": 0,
    "waves": 0,
    "wave_runs": 0,
    "wave_requests": 0,
}


def pytest_configure(config: pytest.Config) -> None:
    from pytest_prefixcache.verify.closed_loop import markers
    from pytest_prefixcache.verify.verifier import Verifier

    run, run_waves = Verifier.run, Verifier.run_waves

    def counted_run(self: Verifier, stream: Sequence[Request], **kwargs: Any) -> Any:
        COUNTS["stream_runs"] += 1
        COUNTS["closed_loop_streams"] += any(markers(r) for r in stream)
        return run(self, stream, **kwargs)

    def counted_waves(self: Verifier, waves: Sequence[Wave], **kwargs: Any) -> Any:
        COUNTS["wave_runs"] += 1
        COUNTS["waves"] += len(waves)
        COUNTS["wave_requests"] += sum(len(w.requests) for w in waves)
        return run_waves(self, waves, **kwargs)

    Verifier.run = counted_run  # type: ignore[method-assign]
    Verifier.run_waves = counted_waves  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    path = os.environ.get("PREFIXCACHE_VERIFY_COUNTS")
    if path:  # one file per process: under pytest-xdist the workers count, the reader sums
        with open(f"{path}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", "w") as f:
            json.dump(COUNTS, f, indent=1)
