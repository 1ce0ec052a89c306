"""Fresh servers forked from a parent that has only imported: the audit without the start-ups.

The baseline audit proves the uncached baseline cold with a new server process per audited
request (DESIGN.md, "Principles of the verdict", rule 2). Started from scratch, each one pays
the interpreter and its imports again: for the reference server nearly all of its start-up is
importing mlx-vlm and transformers, not loading the tiny model (README, "What verification
costs"). For a command of the form ``{python} -m MODULE ARGS``, a :class:`ForkServer` imports
MODULE's dependencies once, in a process of its own that never loads a model and never serves
a request, and forks one child per server (on Linux: see :data:`.fresh.FORK_BY_DEFAULT`).
The child takes its own session, environment, working directory (the server's private HOME)
and log, then runs MODULE as ``__main__`` with ARGS, as ``python -m`` would: its model, engine
and caches are built after the fork, so what it inherits is imported code only.

MODULE itself is imported and dropped again (the child runs it afresh); the modules named in its
``PREFIXCACHE_PRELOAD`` (what its ``main`` imports lazily) stay imported. Import-time state that
reads the environment (a library's cache paths, say) was computed under the fork server's own
private HOME; :meth:`ForkServer.spawn` refuses to fork once anything has been written there, so
no child can find what an earlier child left.

Run as ``python -m pytest_prefixcache.adapters.http.forkserver MODULE``: one JSON line per fork on
stdin (``argv``, ``env``, ``cwd``, ``log``), one JSON line back (``pid`` or ``error``); each
child's exit code is written to ``$PREFIXCACHE_FORK_EXITS/PID``. It exits when stdin closes.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import EngineError
from ..environment import START_TIMEOUT

__all__ = ["ForkServer", "ForkedProcess", "fork_module"]

EXITS_ENV = "PREFIXCACHE_FORK_EXITS"


def fork_module(cmd: Sequence[str]) -> str | None:
    """MODULE when ``cmd`` is ``{python} -m MODULE ...`` with this interpreter: ``{python}``,
    or a path or a name on PATH in this interpreter's directory (its environment) that is the
    same program (``python`` for ``python3`` in a virtual environment); else None."""
    if len(cmd) < 3 or cmd[1] != "-m":
        return None
    if cmd[0] == "{python}":
        return cmd[2]
    found = shutil.which(cmd[0])
    if found is None:
        return None
    here = os.path.abspath(sys.executable)
    same_dir = os.path.dirname(os.path.abspath(found)) == os.path.dirname(here)
    return cmd[2] if same_dir and os.path.samefile(found, here) else None


class ForkedProcess:
    """A forked server, stopped by its PID; its exit code comes from the fork server (which
    stops its children before it exits: once it is gone, so is the child)."""

    def __init__(self, pid: int, exits: str, parent: subprocess.Popen[bytes]) -> None:
        self.pid = pid
        self._exit_file = os.path.join(exits, str(pid))
        self._parent = parent
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            gone = self._parent.poll() is not None  # before the file: no race with its exit
            try:
                with open(self._exit_file) as f:
                    self.returncode = int(f.read().strip() or "-1")
            except (OSError, ValueError):
                if not gone:
                    return None
                self.returncode = -int(signal.SIGTERM)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        return code

    def _signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)


class ForkServer:
    """A process that has imported ``module`` and forks servers that run it.

    Args:
        module: the server's module (``python -m MODULE``).
        env: the fork server's environment (the same isolation as the servers' own, with a
            private HOME under :attr:`root`).
        start_timeout: seconds to wait for the imports.
    """

    def __init__(
        self, module: str, env: Mapping[str, str], *, start_timeout: float = START_TIMEOUT
    ):
        self.module = module
        self.root = tempfile.mkdtemp(prefix="prefixcache-forkserver-")
        self.home = os.path.join(self.root, "home")
        self.exits = os.path.join(self.root, "exits")
        os.makedirs(self.exits)
        env = {k: v.replace("{home}", self.home) for k, v in env.items()}
        env[EXITS_ENV] = self.exits
        for key in ("HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME"):
            os.makedirs(env.get(key, self.home), exist_ok=True)
        self._lock = threading.Lock()
        with open(os.path.join(self.root, "forkserver.log"), "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", __name__, module],
                env=env,
                cwd=self.home,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                bufsize=0,
            )
        self._finalizer = weakref.finalize(self, _close, self.proc, self.root)
        try:
            self._reply(start_timeout, "importing " + module)
        except EngineError:
            self.close()
            raise
        self._baseline = self._written()  # what the imports wrote; a child may add nothing

    def _written(self) -> list[str]:
        return sorted(os.path.join(d, f) for d, _, files in os.walk(self.home) for f in files)

    def _reply(self, timeout: float, what: str) -> dict[str, object]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            log = os.path.join(self.root, "forkserver.log")
            try:
                with open(log, errors="replace") as f:
                    tail = "\n".join(f.read().splitlines()[-20:])
            except OSError:
                tail = ""
            state = "no reply" if not ready else f"it exited ({self.proc.poll()})"
            raise EngineError(f"the fork server for {self.module} failed {what}: {state}; {tail}")
        reply: dict[str, object] = json.loads(line)
        if "error" in reply:
            raise EngineError(f"the fork server for {self.module}: {reply['error']}")
        return reply

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], *, cwd: str, log: str
    ) -> ForkedProcess:
        """Fork a child that runs ``argv`` (``python -m MODULE ARGS``) in ``cwd`` with ``env``,
        its output in ``log``."""
        if fork_module(argv) != self.module:
            raise EngineError(f"{list(argv)!r} is not 'python -m {self.module} ...'")
        written = self._written()
        if written != self._baseline:
            raise EngineError(
                f"something wrote to the fork server's HOME ({written[:3]}): a forked server "
                "would see what an earlier one left; start servers without forking "
                "(OpenAIEngine(fork=False), PREFIXCACHE_FORK=0)"
            )
        request = {"argv": list(argv[3:]), "env": dict(env), "cwd": cwd, "log": str(log)}
        with self._lock:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(json.dumps(request).encode() + b"\n")
                self.proc.stdin.flush()
            except OSError as exc:
                raise EngineError(f"the fork server for {self.module} is gone: {exc}") from None
            reply = self._reply(30.0, "to fork")
        return ForkedProcess(int(reply["pid"]), self.exits, self.proc)  # type: ignore[call-overload]

    def close(self) -> None:
        """Stop the fork server by its PID (it stops the children still running) and remove
        its directory; also at garbage collection and interpreter exit."""
        self._finalizer()


def _close(proc: subprocess.Popen[bytes], root: str) -> None:
    try:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- the fork server process -------------------------------------------------------------------
_children: set[int] = set()


def _exited(pid: int, status: int) -> None:
    _children.discard(pid)
    path = os.path.join(os.environ[EXITS_ENV], str(pid))
    with open(path + ".tmp", "w") as f:
        f.write(str(os.waitstatus_to_exitcode(status)))
    os.replace(path + ".tmp", path)


def _reap(_signum: int, _frame: object) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _exited(pid, status)


def _stop_children() -> None:
    """Stop the children still running (SIGTERM, SIGKILL after 10 s) and record their exits:
    when its client goes away, so do the servers it forked."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(_children):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while _children and time.monotonic() < deadline:
            for pid in list(_children):
                try:
                    done, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    _children.discard(pid)
                    continue
                if done:
                    _exited(pid, status)
            time.sleep(0.01)


def _terminated(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


def _child(module: str, request: dict[str, Any]) -> None:
    """In the forked child: become the server (never returns)."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        if sys.path and sys.path[0] == os.getcwd():  # ``python -m`` puts its directory first
            sys.path[0] = request["cwd"]
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [module, *request["argv"]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def main(argv: Sequence[str]) -> int:
    module = argv[0]
    try:
        preload = getattr(importlib.import_module(module), "PREFIXCACHE_PRELOAD", ())
        for name in preload:
            importlib.import_module(name)
        sys.modules.pop(module, None)  # the child runs it afresh, as ``python -m`` does
    except BaseException as exc:
        traceback.print_exc()
        os.write(1, json.dumps({"error": f"importing {module}: {exc!r}"}).encode() + b"\n")
        return 1
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGTERM, _terminated)
    os.write(1, b'{"ready": true}\n')
    try:
        for line in sys.stdin.buffer:
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            # SIGCHLD waits until the child is in _children (a child can exit at once)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
            pid = os.fork()
            if pid == 0:
                _child(module, request)
            _children.add(pid)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            os.write(1, json.dumps({"pid": pid}).encode() + b"\n")
    finally:
        _stop_children()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
