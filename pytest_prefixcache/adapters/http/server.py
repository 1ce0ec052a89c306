"""Starting, probing and stopping an HTTP server process for an adapter (stdlib only).

A server runs as a child process on 127.0.0.1 with a port the adapter picked, in a private
temporary HOME (with HF_HOME, HF_HUB_CACHE and XDG_CACHE_HOME under it), offline, with
mlx-vlm's APC disk tier and telemetry off, so nothing it persists outlives it and a restarted
server is really cold. It is stopped by its own PID, at ``stop()``, when it is garbage
collected, or at interpreter exit.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import EngineError
from ..environment import START_TIMEOUT
from .forkserver import ForkedProcess, ForkServer
from .process_group import stop_group

__all__ = [
    "PORT_TAKEN",
    "START_TRIES",
    "ServerProcess",
    "absolute_paths",
    "connection_problem",
    "free_port",
    "http_json",
    "isolated_env",
    "remove_quietly",
]

#: A server's process: started here (Popen) or forked by a fork server.
Proc = subprocess.Popen[bytes] | ForkedProcess

ISOLATION_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "APC_DISK_ENABLED": "0",
    "RAPID_MLX_TELEMETRY": "0",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(
    method: str,
    url: str,
    body: Mapping[str, Any] | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    response_headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """(status, decoded JSON or text) of one HTTP request; connection errors raise OSError.
    ``response_headers``, when given, receives the reply's headers (names in lower case)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw, got = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        status, raw, got = exc.code, exc.read(), exc.headers
    if response_headers is not None:
        response_headers.update((k.lower(), v) for k, v in got.items())
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, raw.decode(errors="replace")


def connection_problem(exc: OSError, url: str, server: ServerProcess | None = None) -> str:
    """What an OSError from :func:`http_json` means, in words: refused (nobody listens),
    closed without a reply, timed out; with the exit code and log tail of a server started
    here."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    where = urllib.parse.urlsplit(url).netloc or url
    if isinstance(reason, ConnectionRefusedError):
        what = f"connection refused by {where}: the server is not listening"
    elif isinstance(reason, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        what = f"{where} closed the connection without a reply ({reason})"
    elif isinstance(reason, TimeoutError):
        what = f"no reply from {where} within the timeout ({reason})"
    else:
        what = f"{where} did not answer: {reason}"
    if server is None:
        return f"{what} (did it exit?)" if isinstance(reason, ConnectionRefusedError) else what
    code = None
    if server.proc is not None:
        try:  # a server that drops connections is often on its way out: let it finish
            code = server.proc.wait(timeout=2 if isinstance(reason, ConnectionError) else 0.01)
        except subprocess.TimeoutExpired:
            pass
    state = "it is still running" if code is None else f"it exited with code {code}"
    kept = server.kept_log() if code is not None else None
    where = f"kept at {kept}" if kept is not None else str(server.log_path)
    return f"{what} ({state}; its log, {where}:\n{server.log_tail()})"


#: Attempts at starting a server whose picked port was taken before it could bind it.
START_TRIES = 3
#: What a server's log says when its port was taken (errno EADDRINUSE's text).
PORT_TAKEN = "Address already in use"


def absolute_paths(argv: Sequence[str], base: str) -> list[str]:
    """``argv`` with every argument (or ``--option=VALUE``'s value) that is a relative path
    to something that exists under ``base`` made absolute: a server runs in its private HOME,
    where the caller's relative paths (``--model fixtures/tiny-llama``) would not resolve.
    The program itself (``argv[0]``) is left to PATH unless it names a file under ``base``."""
    out = []
    for i, arg in enumerate(argv):
        prefix, value = "", arg
        if arg.startswith("-"):
            prefix, sep, value = arg.partition("=")
            prefix, value = (prefix + sep, value) if sep else (arg, "")
        if value and not os.path.isabs(value) and "{" not in value:
            candidate = os.path.join(base, value)
            is_path = i > 0 or os.sep in value
            if is_path and os.path.exists(candidate):
                value = os.path.normpath(candidate)
        out.append(prefix + value)
    return out


def remove_quietly(path: str) -> None:
    """Remove a file if it exists."""
    if path:
        try:
            os.remove(path)
        except OSError:
            pass


def isolated_env(home: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the isolation variables, HOME and the caches under
    ``home``, then ``extra`` (``{home}`` in a value is ``home``)."""
    env = dict(os.environ)
    hf = os.path.join(home, "hf")
    env.update(ISOLATION_ENV)
    env.update(
        HOME=home,
        HF_HOME=hf,
        HF_HUB_CACHE=os.path.join(hf, "hub"),
        XDG_CACHE_HOME=os.path.join(home, ".cache"),
    )
    env.update({k: v.replace("{home}", home) for k, v in (extra or {}).items()})
    return env


#: Where a server's log is kept when it exits on its own with an error (its HOME, where the log
#: is written, goes when it stops), relative to the directory the server was started from.
KEPT_LOGS = Path(".prefixcache") / "server-logs"


def keep_log(log: Path, base_dir: str, pid: int | None, kept: list[Path]) -> Path | None:
    """Copy ``log`` to :data:`KEPT_LOGS` under ``base_dir`` (named by the server's PID and the
    time) once (``kept`` holds the copy made) and return the copy, or None without a log."""
    if kept:
        return kept[0]
    if not log.is_file():
        return None
    copy = Path(base_dir) / KEPT_LOGS / f"server-{pid or 0}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    try:
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, copy)
    except OSError:
        return None
    kept.append(copy)
    return copy


def _stop(proc: Proc, home: str, base_dir: str = "", kept: list[Path] | None = None) -> None:
    try:
        code = proc.poll()
        if code is not None and code != 0 and base_dir:  # it crashed: its log outlives HOME
            keep_log(Path(home) / "server.log", base_dir, getattr(proc, "pid", None), kept or [])
        if code is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    finally:
        stop_group(proc.pid)
        shutil.rmtree(home, ignore_errors=True)


class ServerProcess:
    """One server process started from a command line with ``{port}`` (and ``{python}``)
    substituted.

    Args:
        cmd: the command, a list of arguments or a shell-like string.
        health_path: polled until it answers 200. Default: ``"/health"``.
        start_timeout: seconds to wait for readiness. Default: ``120``.
        env: extra environment variables (applied after the isolation ones); ``{home}`` in a
            value is the server's private HOME, removed when it stops (``TMPDIR={home}/tmp``
            keeps what a server leaves in the temp directory there: vLLM's ``vllm_dist_*``
            files and IPC sockets). Default: None.
        forker: a fork server that starts this ``{python} -m MODULE`` command by forking
            (see :mod:`.forkserver`). Default: None (a new process).
    """

    def __init__(
        self,
        cmd: Sequence[str] | str,
        *,
        health_path: str = "/health",
        start_timeout: float = START_TIMEOUT,
        env: Mapping[str, str] | None = None,
        forker: ForkServer | None = None,
    ) -> None:
        self.cmd = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
        if not self.cmd:
            raise EngineError("the server command is empty")
        self.health_path = health_path
        self.start_timeout = start_timeout
        self.extra_env = dict(env or {})
        self.forker = forker
        #: Relative paths in the command are resolved against the caller's directory (the
        #: server's own working directory is its private HOME).
        self.base_dir = os.getcwd()
        self.proc: Proc | None = None
        self.port = 0
        self.home = ""
        self._finalizer: Any = None
        self._kept: list[Path] = []  # the copy of its log made once it exited

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return Path(self.home) / "server.log"

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return "(no log)"
        return "\n".join(lines) or "(the log is empty)"

    def kept_log(self) -> Path | None:
        """A copy of the log that outlives the server's HOME, when the server has exited
        (:data:`KEPT_LOGS`); None while it runs or without a log."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return keep_log(self.log_path, self.base_dir, getattr(self.proc, "pid", None), self._kept)

    def log_note(self) -> str:
        """The end of an error message about this server: the last lines of its log, and
        where the whole log is kept when the server has exited."""
        kept = self.kept_log()
        where = f"kept at {kept}" if kept is not None else str(self.log_path)
        return f"\nthe server's log, {where}, ends:\n{self.log_tail()}"

    def start(self) -> ServerProcess:
        """Start on a fresh port in a fresh HOME and wait until the health check answers.

        Everything, retries included, happens within ``start_timeout``: a server that exits
        because its port was taken between :func:`free_port` and its bind (``Address already
        in use`` in its log) is started again on another port, at most :data:`START_TRIES`
        times while time is left; any other failure is raised at once."""
        self.stop()
        deadline = time.monotonic() + self.start_timeout
        for attempt in range(1, START_TRIES + 1):
            try:
                self._start_once(deadline)
                return self
            except EngineError as exc:
                taken = PORT_TAKEN in self.log_tail()
                self.stop()
                if not taken or attempt == START_TRIES or time.monotonic() >= deadline:
                    raise EngineError(str(exc)) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(self, deadline: float) -> None:
        self.port = free_port()
        self.home = tempfile.mkdtemp(prefix="prefixcache-server-")
        argv = [a.format(port=self.port, python=sys.executable) for a in self.cmd]
        try:  # relative paths in the extra environment too (``PREFIXCACHE_SERVER_ENV``)
            extra = {k: absolute_paths([v], self.base_dir)[0] for k, v in self.extra_env.items()}
            env = isolated_env(self.home, extra)
            os.makedirs(env["HF_HUB_CACHE"], exist_ok=True)
            if env.get("TMPDIR", "").startswith(self.home):
                os.makedirs(env["TMPDIR"], exist_ok=True)
            argv = absolute_paths(argv, self.base_dir)
            if self.forker is not None:
                self.proc = self.forker.spawn(argv, env, cwd=self.home, log=str(self.log_path))
            else:
                with open(self.log_path, "wb") as log:
                    self.proc = subprocess.Popen(
                        argv,
                        env=env,
                        cwd=self.home,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
        except (OSError, EngineError) as exc:  # no process: nothing to stop, HOME goes now
            shutil.rmtree(self.home, ignore_errors=True)
            self.proc = None
            if isinstance(exc, EngineError):
                raise
            hint = ""
            if isinstance(exc, FileNotFoundError) and os.sep not in argv[0]:
                hint = (
                    f" ({argv[0]!r} is not on PATH; a Python module runs as "
                    "'{python} -m MODULE', with the interpreter running pytest)"
                )
            raise EngineError(
                f"cannot start the server {shlex.join(argv)!r}: {exc}{hint}"
            ) from None
        self._kept = []
        self._finalizer = weakref.finalize(
            self, _stop, self.proc, self.home, self.base_dir, self._kept
        )
        pause = 0.005  # a forked server answers within ~0.2 s, a started one within seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(
                    f"server {shlex.join(argv)!r} exited with {self.proc.returncode} before it "
                    f"was ready; {self.log_note().strip()}"
                )
            try:
                wait = max(0.05, min(5.0, deadline - time.monotonic()))
                status, _ = http_json("GET", self.url + self.health_path, timeout=wait)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(pause)
            pause = min(2 * pause, 0.1)
        raise EngineError(
            f"server {shlex.join(argv)!r} did not answer {self.health_path} within "
            f"{self.start_timeout:g} s (PREFIXCACHE_START_TIMEOUT); log:\n{self.log_tail()}"
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Terminate the process by its PID (kill after 10 s) and remove its HOME."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self.proc = None
