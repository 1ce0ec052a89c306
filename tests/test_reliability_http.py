"""The plugin against an OpenAI-compatible server that breaks mid-run: it dies, answers 500,
or answers malformed JSON. Each ends in a specific failure with a replay path, promptly.

The servers are small stdlib ``http.server`` fakes on 127.0.0.1 (ephemeral ports), run in
a daemon thread of the pytest session under test.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from plugin_support import REPLAY_LINE, run_file

from pytest_prefixcache import EngineError, Message, Request
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.http.server import ServerProcess, free_port

pytest_plugins = ["pytester"]

FAKE_SERVER = """
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pytest_prefixcache.adapters.http.openai import OpenAIEngine


def _reply(body):
    seed = hashlib.sha256(json.dumps(body["messages"], sort_keys=True).encode()).digest()
    steps = []
    for i in range(body["max_tokens"]):
        top = [{"id": (seed[i % 32] + k) % 200, "logprob": -0.1 - k} for k in range(5)]
        steps.append({"top_logprobs": top})
    usage = {"prompt_tokens": 40, "completion_tokens": len(steps),
             "prompt_tokens_details": {"cached_tokens": 0}}
    return {"choices": [{"logprobs": {"content": steps}}], "usage": usage}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status, raw):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self):
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        if srv.dead:
            self.close_connection = True
            return
        if self.path == "/v1/cache/reset":
            return self._send(200, b"{}")
        srv.count += 1
        if srv.count <= srv.after:
            return self._send(200, json.dumps(_reply(body)).encode())
        if srv.mode == "dies":  # no reply on this connection, and nobody listens any more
            srv.dead = True
            self.close_connection = True
            threading.Thread(target=lambda: (srv.shutdown(), srv.server_close()),
                             daemon=True).start()
            return
        if srv.mode == "error500":
            return self._send(500, b'{"error": {"message": "internal error: KV pool exhausted"}}')
        self._send(200, b'{"choices": [{"logprobs": {"content": [')  # truncated JSON


def _serve(mode, after=6):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.mode, srv.after, srv.count, srv.dead = mode, after, 0, False
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    return OpenAIEngine(url=url, cold="salt", namespace_header="x-tenant", timeout=10)


healthy = lambda: _serve("ok", after=10**9)
dies = lambda: _serve("dies")
error500 = lambda: _serve("error500")
malformed = lambda: _serve("malformed")
"""


def _run(pytester: pytest.Pytester, engine: str) -> pytest.RunResult:
    pytester.makepyfile(fakeserver=FAKE_SERVER)
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--prefixcache-verify",
        f"--prefixcache-engine=fakeserver:{engine}", "--prefixcache-examples=10",
        "--prefixcache-seed=1", "--prefixcache-timeout=20",
        "-k", "request_streams", timeout=600,  # a guard against a hang
    )  # fmt: skip


@pytest.mark.slow
def test_a_healthy_fake_server_passes(pytester: pytest.Pytester) -> None:
    """The control: the fake server itself is a correct (cacheless) engine."""
    _run(pytester, "healthy").assert_outcomes(passed=1)


BROKEN = [
    # after the death Hypothesis shrinks, so the reported call may be a run or the reset
    ("dies", "fault: * raised EngineError: *connection refused by 127.0.0.1:*: the server is "
     "not listening (did it exit?)"),
    ("error500", "fault: run(request *, use_cache=*) raised EngineError: "
     "http://127.0.0.1:*/v1/chat/completions answered 500: *KV pool exhausted*"),
    ("malformed", "fault: run(request *, use_cache=*) raised EngineError: unexpected chat "
     "completion reply (*): *"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "line"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_server_fails_clearly_and_promptly(
    pytester: pytest.Pytester, engine: str, line: str
) -> None:
    result = _run(pytester, engine)
    result.assert_outcomes(failed=1)
    result.stdout.no_fnmatch_line("*EngineTimeout*")  # promptly: the server's error, no timeout
    result.stdout.fnmatch_lines(
        [
            f"E *pytest_prefixcache.errors.EngineFault: {line}",
            f"E *replay: {REPLAY_LINE}",
        ]
    )
    assert run_file(pytester.path)["flags"][1:] == [
        f"--prefixcache-engine=fakeserver:{engine}",
        "--prefixcache-timeout=20",
    ]
    result.stdout.fnmatch_lines(["failures by check: fault: 1"])
    assert list(pytester.path.glob(".prefixcache/failures/*/stream.json"))


HELLO = Request((Message("user", ("hello",)),), max_new_tokens=1)


def test_connection_refused_says_nobody_listens() -> None:
    """Nothing listens on the port: the message says so in words (it once read
    'answered 0' for the reset), for the request and for the reset."""
    url = f"http://127.0.0.1:{free_port()}"
    engine = OpenAIEngine(url=url, cold="reset", cold_url=url, timeout=5)
    where = re.escape(url.removeprefix("http://"))
    refused = f"connection refused by {where}: the server is not listening \\(did it exit\\?\\)"
    with pytest.raises(EngineError, match=f"^POST {re.escape(url)}/v1/chat/completions: {refused}"):
        engine.run(HELLO, use_cache=True)
    with pytest.raises(
        EngineError, match=f"^cannot reset {re.escape(url)}: POST /v1/cache/reset: "
    ):
        engine.reset()
    with pytest.raises(EngineError, match=refused):
        engine.reset()


#: A server that is ready, then exits with code 3 on the first chat request, without a reply.
EXITS = """
import os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"{}")
    def do_POST(self):
        print("the fake server gives up", flush=True)
        os._exit(3)

HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_started_server_that_exits_is_named_with_its_exit_code_and_log(tmp_path: Path) -> None:
    script = tmp_path / "exits.py"  # a file: the command's {port} is substituted by format()
    script.write_text(EXITS)
    engine = OpenAIEngine(
        [sys.executable, str(script), "{port}"], cold="salt", namespace_header="x-ns", timeout=10
    )
    try:
        closed = "closed the connection without a reply .* [(]it exited with code 3; its log"
        with pytest.raises(EngineError, match=closed):
            engine.run(HELLO, use_cache=True)
        with pytest.raises(EngineError) as info:
            engine.run(HELLO, use_cache=True)
        message = str(info.value)
        assert "connection refused by 127.0.0.1:" in message
        assert "the server is not listening (it exited with code 3; its log, " in message
        assert message.rstrip().endswith("the fake server gives up)")
    finally:
        engine.close()


LEAVES_TEMP = """
import sys, tempfile
from http.server import BaseHTTPRequestHandler, HTTPServer

tempfile.mkstemp(prefix="left-by-the-server-")  # as vLLM leaves vllm_dist_* files

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.mark.parametrize("private", [True, False], ids=["home-tmp", "shared-tmp"])
def test_what_a_server_leaves_in_its_temp_directory_goes_with_its_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private: bool
) -> None:
    script = tmp_path / "leaves.py"
    script.write_text(LEAVES_TEMP)
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    monkeypatch.setenv("TMPDIR", str(shared))
    env = {"TMPDIR": "{home}/tmp"} if private else {}
    server = ServerProcess([sys.executable, str(script), "{port}"], env=env).start()
    home = Path(server.home)
    where = (home / "tmp") if private else shared
    assert list(where.glob("left-by-the-server-*")), "the server wrote no temp file"
    server.stop()
    assert not home.exists()
    # negative control: without the private TMPDIR the file outlives the server
    assert bool(list(shared.glob("left-by-the-server-*"))) is not private
