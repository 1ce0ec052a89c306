"""The baseline audit's fresh servers: one per audited request, never reused.

:meth:`.openai.OpenAIEngine.fresh_instance` takes its server from :class:`FreshServers`. For a
``{python} -m MODULE ...`` command on Linux the adapter's servers (its cached and cold ones
too) are forked from a fork server that has imported MODULE (:class:`Forks`,
:mod:`.forkserver`), and the audit's next one is started ahead, in a background thread, while
the audit runs the current one: what is left of a forked start (the child loading its model)
is then hidden behind the requests between two audited ones. Other commands start a new
process per audited request, when it is asked for (a server that takes minutes to start and
gigabytes to run, like vLLM, is not doubled up).

Either way every server handed out has been started for the caller alone and sent nothing
before: :meth:`FreshServers.take` hands each one out exactly once, and the caller stops it.
"""

from __future__ import annotations

import shlex
import sys
import threading
from collections.abc import Callable, Mapping, Sequence

from ..environment import START_TIMEOUT
from .forkserver import ForkServer, fork_module
from .server import ServerProcess, isolated_env

__all__ = ["FORK_BY_DEFAULT", "Forks", "FreshServers"]

#: Whether servers are forked unless told otherwise: on Linux. On macOS a process that has
#: imported MLX has loaded Metal and the Objective-C runtime, which are not safe to fork.
FORK_BY_DEFAULT = sys.platform.startswith("linux")


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


class Forks:
    """An adapter's fork servers, one per module, each started when a command first needs it.

    Args:
        fork: whether to fork at all (off: every command starts a new process). Default:
            None (:data:`FORK_BY_DEFAULT`: on Linux).
        env: the servers' extra environment (the fork servers get the same).
        start_timeout: seconds for a fork server's imports.
    """

    def __init__(
        self,
        *,
        fork: bool | None = None,
        env: Mapping[str, str] | None = None,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        self.fork = FORK_BY_DEFAULT if fork is None else fork
        self._env = dict(env or {})
        self._timeout = start_timeout
        self._servers: dict[str, ForkServer] = {}
        self._lock = threading.Lock()

    def get(self, cmd: Sequence[str] | str) -> ForkServer | None:
        """The fork server for ``cmd``, or None when it is not ``{python} -m MODULE ...``."""
        module = fork_module(shlex.split(cmd) if isinstance(cmd, str) else list(cmd))
        if not self.fork or module is None:
            return None
        with self._lock:
            if module not in self._servers:
                env = isolated_env("{home}", self._env)
                self._servers[module] = ForkServer(module, env, start_timeout=self._timeout)
            return self._servers[module]

    def close(self) -> None:
        """Stop every fork server (and so the servers they forked that still run)."""
        with self._lock:
            for forker in self._servers.values():
                forker.close()
            self._servers.clear()


class FreshServers:
    """Servers for the audit, each handed out once.

    Args:
        start: starts a new server and returns it.
        ahead: start the next one while the caller uses this one (cheap, forked starts).
    """

    def __init__(self, start: Callable[[], ServerProcess], *, ahead: bool) -> None:
        self._start = start
        self.ahead = ahead
        self._ahead: _Ahead | None = None
        self._lock = threading.Lock()

    def take(self) -> ServerProcess:
        """A server started for the caller alone, sent nothing yet; the caller stops it."""
        with self._lock:
            ahead, self._ahead = self._ahead, None
            server = ahead.result() if ahead is not None else self._start()
            if self.ahead:
                self._ahead = _Ahead(self._start)
            return server

    def close(self) -> None:
        """Stop the server started ahead, if any."""
        with self._lock:
            if self._ahead is not None:
                self._ahead.discard()
                self._ahead = None
