"""A stopped server takes its process group with it: a child it spawned and left running when
it exited (vLLM's EngineCore after its API server died was seen orphaned, running on, an hour
later) is stopped with it (``http.process_group.stop_group``)."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from pytest_prefixcache.adapters.http import server as server_module
from pytest_prefixcache.adapters.http.server import ServerProcess

#: A server that starts a child which ignores SIGTERM and outlives it (argv: PORT PIDFILE), and
#: exits at once on SIGTERM without stopping that child.
LEAKY = """
import http.server, signal, subprocess, sys
IGNORE = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
child = subprocess.Popen([sys.executable, "-c", IGNORE])
open(sys.argv[2], "w").write(str(child.pid))
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie no one reaped yet counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, float]:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY, encoding="utf-8")
    pidfile = tmp_path / "child.pid"
    server = ServerProcess(f"{{python}} {script} {{port}} {pidfile}", start_timeout=30).start()
    child = int(pidfile.read_text())
    assert _alive(child)
    start = time.monotonic()
    server.stop()
    return child, time.monotonic() - start


def test_a_child_the_server_left_running_is_stopped_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    child, seconds = _run(tmp_path, monkeypatch)
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the server's child outlived its stop"
    assert seconds < 10, seconds  # SIGTERM ignored: SIGKILL after the group's grace


def test_control_without_the_group_stop_the_child_outlives_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "stop_group", lambda pid: None)
    child, _ = _run(tmp_path, monkeypatch)
    try:
        time.sleep(0.5)
        assert _alive(child), "the control's child was stopped without the group stop"
    finally:
        os.kill(child, signal.SIGKILL)
