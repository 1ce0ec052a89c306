"""Calling the engine under a timeout, so a hung engine never hangs pytest.

Every engine call (building it, ``reset()``, ``run()``) happens on one daemon worker thread:
an engine sees a single thread, as it would behind a server loop, and thread-local state
(MLX streams, for one) stays valid. The caller waits at most ``timeout`` seconds; after a
timeout the worker is abandoned (it is a daemon, so it cannot keep the process alive) and the
engine is treated as dead.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_TIMEOUT", "CallResult", "CallTimedOut", "EngineWorker", "Job"]


#: Seconds an engine call may take before the engine is treated as dead.
DEFAULT_TIMEOUT = 60.0


class CallTimedOut(Exception):
    """Raised by :meth:`EngineWorker.call` when the call did not finish in time."""

    def __init__(self, what: str, timeout: float) -> None:
        super().__init__(f"{what} did not answer within {timeout:g} s")
        self.what = what
        self.timeout = timeout


@dataclass(frozen=True)
class CallResult:
    """What one engine call gave: a value, or the exception it raised, and how long it took."""

    value: Any = None
    error: BaseException | None = None
    traceback: str = ""
    seconds: float = 0.0


class Job:
    """A call handed to a worker (:meth:`EngineWorker.submit`): ``done`` is set once
    ``result`` holds its value or error."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result = CallResult()


class EngineWorker:
    """A single daemon thread that runs engine calls one at a time."""

    def __init__(self, name: str = "prefixcache-engine") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.dead: str | None = None
        """Why the engine is considered dead (set after a timeout), else None."""

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            start = time.perf_counter()
            try:
                value = job.fn()
                job.result = CallResult(value=value, seconds=time.perf_counter() - start)
            except BaseException as exc:  # the caller decides; never kill the worker silently
                job.result = CallResult(
                    error=exc,
                    traceback="".join(
                        traceback.format_exception(type(exc), exc, exc.__traceback__)
                    ),
                    seconds=time.perf_counter() - start,
                )
            job.done.set()

    def submit(self, fn: Callable[[], Any]) -> Job:
        """Queue ``fn()`` on the worker and return at once; ``job.done`` is set when it ends
        and ``job.result`` then holds what it gave (the waves send requests this way)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
        job = Job(fn)
        self._jobs.put(job)
        return job

    def call(self, fn: Callable[[], Any], *, timeout: float, what: str) -> CallResult:
        """Run ``fn()`` on the worker; raise :class:`CallTimedOut` if it takes over ``timeout``."""
        if self.dead is not None:
            raise CallTimedOut(what, timeout)
        job = self.submit(fn)
        if not job.done.wait(timeout):
            self.dead = f"{what} did not answer within {timeout:g} s"
            raise CallTimedOut(what, timeout)
        return job.result

    def close(self) -> None:
        """End of session: drain MLX's streams from the calling (main) thread.

        The idle worker is left blocked on its queue (a daemon, so it cannot keep the process
        alive) and later calls still run on it: a thread that ran MLX work and then ended makes
        MLX 0.32 abort at interpreter exit now and then ("terminate called without an active
        exception"); a live, blocked daemon does not. A hung worker is left behind as it is.
        """
        if self._thread is not None and self.dead is None:
            _drain_mlx()


def _drain_mlx() -> None:
    """If the engine used MLX, wait for its streams from the calling (main) thread.

    Without this, a process whose MLX work ran on the worker thread aborts at exit about one
    time in ten ("terminate called without an active exception", exit -6) on MLX 0.32 CPU;
    with it, 0 of 40 runs did. MLX is never imported here, only used if already loaded.
    """
    mx = sys.modules.get("mlx.core")
    synchronize = getattr(mx, "synchronize", None)
    if callable(synchronize):
        try:
            synchronize()
        except Exception:  # a broken engine must not turn a clean exit into a crash
            pass
