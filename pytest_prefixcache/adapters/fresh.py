"""The baseline audit's fresh servers: one per audited request, never reused.

:meth:`.openai.OpenAIEngine.fresh_instance` takes its server from :class:`FreshServers`. For a
``{python} -m MODULE ...`` command the servers are forked from a fork server that has imported
MODULE (:mod:`.forkserver`), and the next one is started ahead, in a background thread, while
the audit runs the current one: a forked start costs ~0.2 s (the tiny model's load in the
child), which the requests between two audited ones hide. Other commands start a new process
per audited request, when it is asked for (a server that takes minutes to start and gigabytes
to run, like vLLM, is not doubled up).

Either way every server handed out has been started for the caller alone and sent nothing
before: :meth:`FreshServers.take` hands each one out exactly once, and the caller stops it.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable, Mapping, Sequence

from .forkserver import ForkServer, fork_module
from .server import ServerProcess, isolated_env

__all__ = ["FreshServers"]


class _Ahead:
    """One server being started in a background thread."""

    def __init__(self, start: Callable[[], ServerProcess]) -> None:
        self.server: ServerProcess | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(start,), daemon=True)
        self._thread.start()

    def _run(self, start: Callable[[], ServerProcess]) -> None:
        try:
            self.server = start()
        except BaseException as exc:
            self.error = exc

    def result(self) -> ServerProcess:
        self._thread.join()
        if self.error is not None:
            raise self.error
        assert self.server is not None
        return self.server

    def discard(self) -> None:
        self._thread.join()
        if self.server is not None:
            self.server.stop()


class FreshServers:
    """Servers started from ``cmd`` for the audit, each handed out once.

    Args:
        cmd: the baseline's server command (``{port}``, ``{python}``).
        start: starts a ServerProcess for ``cmd`` (with a fork server or None) and returns it.
        fork: fork ``{python} -m MODULE`` commands (and start one ahead). Default: ``True``.
        env: the servers' extra environment (the fork server gets the same).
        start_timeout: seconds for the fork server's imports.
    """

    def __init__(
        self,
        cmd: Sequence[str] | str,
        start: Callable[[ForkServer | None], ServerProcess],
        *,
        fork: bool = True,
        env: Mapping[str, str] | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
        self.module = fork_module(argv) if fork else None
        self._start = start
        self._env = dict(env or {})
        self._timeout = start_timeout
        self._forker: ForkServer | None = None
        self._ahead: _Ahead | None = None
        self._lock = threading.Lock()

    @property
    def forked(self) -> bool:
        """Whether the servers are forked (and one is started ahead)."""
        return self.module is not None

    def _fork_server(self) -> ForkServer | None:
        if self.module is not None and self._forker is None:
            env = isolated_env("{home}", self._env)
            self._forker = ForkServer(self.module, env, start_timeout=self._timeout)
        return self._forker

    def take(self) -> ServerProcess:
        """A server started for the caller alone, sent nothing yet; the caller stops it."""
        with self._lock:
            ahead, self._ahead = self._ahead, None
            forker = self._fork_server()
            server = ahead.result() if ahead is not None else self._start(forker)
            if forker is not None:
                self._ahead = _Ahead(lambda: self._start(forker))
            return server

    def close(self) -> None:
        """Stop the server started ahead, if any, and the fork server."""
        with self._lock:
            if self._ahead is not None:
                self._ahead.discard()
                self._ahead = None
            if self._forker is not None:
                self._forker.close()
                self._forker = None
