"""Servers verified from the docs alone (issue 25, item 2): what a server's start-up and its
errors tell the user, and what they leave behind.

- A missing binary is an EngineError naming it, and its private HOME is removed at once.
- The start timeout bounds the whole start: a server that never answers is started once and
  given up at the timeout; only a server whose port was taken (``Address already in use``)
  is started again, at most ``START_TRIES`` times.
- Relative paths in a server command resolve against the caller's directory, not the
  server's private HOME (its working directory).
- An HTTP error or a refused reset ends with the last lines of the server's log.
- No speedup is computed from uncached runs that restart a server.
- The INCOMPLETE advice names what a server's user can set.
- The reference server on a busy port says ``Address already in use``.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import tempfile
from pathlib import Path

import pytest
from plugin_support import run_suite, with_fakes

from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.http.server import START_TRIES, ServerProcess, absolute_paths
from pytest_prefixcache.checks.coverage import gap_lines
from pytest_prefixcache.errors import EngineError
from pytest_prefixcache.output.report import Report
from pytest_prefixcache.types import Message, Request

pytest_plugins = ["pytester"]

#: A server that answers GET /health, and 500 to every POST after writing a line to its log;
#: argv: PORT [STARTS_FILE]: each start appends a line to STARTS_FILE.
HEALTHY = """
import http.server, os, sys
port = int(sys.argv[1])
print("argv", sys.argv[2:], "DATA", os.environ.get("DATA"), flush=True)
if len(sys.argv) > 2 and not sys.argv[2].startswith("-"):
    open(sys.argv[2], "a").write("start\\n")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def do_POST(self):
        print("the model exploded on this request", flush=True)
        self.send_response(500); self.send_header("Content-Type", "application/json")
        self.end_headers(); self.wfile.write(b'{"error": "internal"}')
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""
#: Counts its starts, then never answers.
SILENT = "import sys, time\nopen(sys.argv[2], 'a').write('start\\n')\ntime.sleep(120)\n"
#: Counts its starts, then exits as a server whose port was taken does (or with another
#: error when argv[3] says so).
TAKEN = """
import sys
open(sys.argv[2], "a").write("start\\n")
print("loading the model...")
if sys.argv[3:] == ["other"]:
    print("ValueError: no config.json in the model directory")
else:
    print("OSError: [Errno 98] Address already in use")
sys.exit(1)
"""


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _starts(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty temp directory that tempfile uses (the servers' private HOMEs go there)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def test_a_missing_binary_is_named_and_leaves_no_home(temp_dir: Path) -> None:
    server = ServerProcess("no-such-server-binary-xyz --port {port}", start_timeout=5)
    with pytest.raises(
        EngineError, match="cannot start the server 'no-such-server-binary-xyz"
    ) as err:
        server.start()
    assert "not on PATH; a Python module runs as '{python} -m MODULE'" in str(err.value)
    assert list(temp_dir.iterdir()) == []


def test_a_started_server_s_home_is_in_the_temp_dir_until_it_stops(
    temp_dir: Path, tmp_path: Path
) -> None:
    """Control for the test above: the HOME is made there, and goes when the server stops."""
    script = _script(tmp_path / "healthy.py", HEALTHY)
    server = ServerProcess(f"{{python}} {script} {{port}}", start_timeout=30).start()
    try:
        assert [p.name[:18] for p in temp_dir.iterdir()] == ["prefixcache-server"]
    finally:
        server.stop()
    assert list(temp_dir.iterdir()) == []


def test_a_server_that_never_answers_is_started_once(temp_dir: Path, tmp_path: Path) -> None:
    """The start timeout bounds the whole start: one start, not one per retry."""
    script = _script(tmp_path / "silent.py", SILENT)
    starts = tmp_path / "starts"
    server = ServerProcess(f"{{python}} {script} {{port}} {starts}", start_timeout=1.5)
    with pytest.raises(EngineError, match=r"did not answer /health within 1\.5 s") as err:
        server.start()
    assert str(err.value).endswith("log:\n(the log is empty)")
    assert _starts(starts) == 1
    assert list(temp_dir.iterdir()) == []


def test_a_taken_port_is_retried_and_any_other_exit_is_not(temp_dir: Path, tmp_path: Path) -> None:
    script = _script(tmp_path / "taken.py", TAKEN)
    starts = tmp_path / "taken-starts"
    server = ServerProcess(f"{{python}} {script} {{port}} {starts}", start_timeout=60)
    with pytest.raises(EngineError, match="Address already in use"):
        server.start()
    assert _starts(starts) == START_TRIES
    other = tmp_path / "other-starts"
    server = ServerProcess(f"{{python}} {script} {{port}} {other} other", start_timeout=60)
    with pytest.raises(EngineError, match="exited with 1 before it was ready") as err:
        server.start()
    assert _starts(other) == 1  # the control: not a port collision, no retry
    assert str(err.value).rstrip().endswith("no config.json in the model directory")
    assert list(temp_dir.iterdir()) == []


def test_relative_paths_resolve_against_the_caller_s_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _script(tmp_path / "servers" / "healthy.py", HEALTHY)
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    server = ServerProcess(
        "{python} servers/healthy.py {port} --model=models/tiny",
        start_timeout=30,
        env={"DATA": "models/tiny", "HOME_TMP": "{home}/tmp"},
    ).start()
    try:
        assert server.alive()
        assert f"--model={tmp_path / 'models' / 'tiny'}" in server.log_tail()
        assert f"DATA {tmp_path / 'models' / 'tiny'}" in server.log_tail()
    finally:
        server.stop()
    argv = absolute_paths(
        ["python", "-m", "mlx_lm.server", "--model", "models/tiny", "--log=./models",
         "--port", "{port}", "--served-model-name", "missing/dir", "-v"],
        str(tmp_path),
    )  # fmt: skip
    assert argv == [
        "python", "-m", "mlx_lm.server", "--model", str(tmp_path / "models" / "tiny"),
        f"--log={tmp_path / 'models'}", "--port", "{port}", "--served-model-name",
        "missing/dir", "-v",
    ]  # fmt: skip


def test_without_resolving_a_relative_path_the_server_cannot_find_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: the same command from another directory names a path that does
    not exist there; the server exits and the error ends with its log."""
    _script(tmp_path / "servers" / "healthy.py", HEALTHY)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    server = ServerProcess("{python} servers/healthy.py {port}", start_timeout=30)
    with pytest.raises(EngineError, match="No such file or directory"):
        server.start()


def _request() -> Request:
    return Request((Message("user", "hello"),))


def test_an_http_error_ends_with_the_server_s_log(tmp_path: Path) -> None:
    script = _script(tmp_path / "healthy.py", HEALTHY)
    with OpenAIEngine(f"{{python}} {script} {{port}}", cold="restart", fork=False) as engine:
        with pytest.raises(EngineError) as err:
            engine.run(_request(), use_cache=True)
    message = str(err.value)
    assert "answered 500" in message
    assert message.rstrip().endswith("the model exploded on this request")


def test_uncached_runs_that_restart_a_server_give_no_speedup(tmp_path: Path) -> None:
    script = _script(tmp_path / "healthy.py", HEALTHY)
    cmd = f"{{python}} {script} {{port}}"
    with OpenAIEngine(cmd, cold="restart", fork=False) as engine:
        assert "restart a server" in engine.uncached_times_skewed
    with OpenAIEngine(cmd, cold="server", fork=False) as engine:
        assert engine.uncached_times_skewed == ""  # control: a second server, not restarted
    report = Report(requests=4, cache_hits=2, warm_seconds=1.0, cold_seconds=21.69)
    assert any("(speedup 21.69x)" in line for line in report.lines())
    report.speedup_not_measured = engine_why = "the uncached runs restart a server"
    lines = "\n".join(report.lines())
    assert "speedup 21.69x" not in lines
    assert f"time on cache hits: no speedup computed ({engine_why})" in lines


def test_the_incomplete_advice_names_what_a_server_user_can_set() -> None:
    gaps = {"reuse bound": {"no token_ids": 3}, "shapes": {"no merges": 2}}
    server = "\n".join(gap_lines(gaps, server=True))
    assert "PREFIXCACHE_RENDER=text:DIR or vlm:DIR" in server
    assert "PREFIXCACHE_TEXT_ONLY=1" in server
    assert "return Outcome" not in server
    engine = "\n".join(gap_lines(gaps))  # control: an in-process engine's advice
    assert "return Outcome.token_ids" in engine and "PREFIXCACHE_" not in engine
    report = Report(requests=3, coverage={"reuse bound": {"no token_ids": 3}}, server=True)
    assert "PREFIXCACHE_RENDER" in "\n".join(report.verdict_lines())


def test_the_reference_server_on_a_busy_port_says_address_in_use() -> None:
    pytest.importorskip("mlx.core")
    from reference_engine.server import make_server

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError) as err:
            make_server(object(), "127.0.0.1", port)  # type: ignore[arg-type]
    assert err.value.errno == errno.EADDRINUSE  # not AttributeError: '_Server' ... '_worker'
    free = make_server(object(), "127.0.0.1", 0)  # type: ignore[arg-type]
    free.server_close()  # control: a free port binds


def test_the_reference_server_command_reports_the_busy_port(tmp_path: Path) -> None:
    pytest.importorskip("mlx_vlm")
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {**os.environ, "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
        res = subprocess.run(
            [sys.executable, "-m", "reference_engine.server", "--port", str(port)],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
        )  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in res.stdout
    assert "Address already in use" in res.stdout and "Traceback" not in res.stderr


SKEWED = """
from fakeengines import FakeEngine


class Restarting(FakeEngine):
    uncached_times_skewed = "the uncached runs restart a server (a test)"


def build():
    return Restarting()
"""


def test_a_suite_run_on_skewed_uncached_times_prints_no_speedup(
    pytester: pytest.Pytester,
) -> None:
    with_fakes(pytester)
    pytester.makepyfile(skewed=SKEWED)
    args = ("-k", "request_streams", "--prefixcache-report=r.json")
    control = run_suite(pytester, "good", *args, examples=3)
    assert control.ret == 0 and "(speedup " in control.stdout.str()
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-engine=skewed:build",
        "--prefixcache-examples=3", "--prefixcache-seed=1", *args,
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 0, out
    assert "time on cache hits: no speedup computed (the uncached runs restart a server" in out
    assert "(speedup " not in out
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["warm_seconds"] == report["cold_seconds"] == 0.0
    assert report["speedup_not_measured"].startswith("the uncached runs restart a server")
