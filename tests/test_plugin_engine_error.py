"""An engine that cannot be built is ONE error (issue 25, item 3): one traceback in the
terminal, one error in the JSON report, the JUnit XML and the HTML page (badge ERROR), exit
code 2; the other tests that need the engine are skipped, never one error each. Negative
control: an engine that builds gives no error and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from plugin_support import run_suite, with_fakes

from pytest_prefixcache.html import render_html
from pytest_prefixcache.output.report import Report

pytest_plugins = ["pytester"]

FACTORY = """
def build():
    return _load_weights()


def _load_weights():
    raise RuntimeError("no weights in /nowhere")
"""


def _one_error(result: pytest.RunResult, tmp: Path, needle: str) -> dict[str, object]:
    """Assert one error everywhere; return the JSON report."""
    out = result.stdout.str()
    assert result.ret == 2, out
    assert out.count("ERROR at setup") == 1, out
    result.assert_outcomes(errors=1, skipped=7, deselected=1)
    assert "the engine could not be built (the error above)" in out or "-rs" not in out
    assert "verdict: ERROR: the engine could not be built (exit code 2)" in out
    report = json.loads((tmp / "r.json").read_text())
    assert report["verdict"] == "error" and needle in report["engine_error"]
    assert [f["check"] for f in report["failures"]] == ["error"]
    suite = ET.parse(tmp / "j.xml").getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("errors"), suite.get("failures"), suite.get("skipped")) == ("1", "0", "7")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["prefixcache_verdict"] == "error"
    page = render_html(Report.read_json(tmp / "r.json"))
    assert '<div id="verdict" class="verdict fail">ERROR: the engine could not be built</div>' in (
        page
    )
    assert "FAIL:" not in page and page.count('class="card failure"') == 1
    return report


@pytest.fixture
def server_env() -> Iterator[None]:
    """An in-process session with --prefixcache-server-cmd exports PREFIXCACHE_SERVER_CMD (and
    PREFIXCACHE_EXTRA_BODY) for its engine factory: it leaves them as they were."""
    before = {k: os.environ.get(k) for k in ("PREFIXCACHE_SERVER_CMD", "PREFIXCACHE_EXTRA_BODY")}
    yield
    assert {k: os.environ.get(k) for k in before} == before


def _args(*more: str) -> list[str]:
    return ["--prefixcache-report=r.json", "--junitxml=j.xml", "--prefixcache-database=none", *more]


def test_a_factory_that_raises_is_one_error_with_its_own_traceback(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(badengine=FACTORY)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-engine=badengine:build",
        *_args(),
    )  # fmt: skip
    report = _one_error(result, pytester.path, "raised RuntimeError: no weights in /nowhere")
    out = result.stdout.str()
    # the traceback starts in the user's factory, once: not in the plugin's worker thread
    assert out.count('raise RuntimeError("no weights in /nowhere")') == 1, out
    assert "return _load_weights()" in out and "worker.py" not in out
    # the message is printed once by its traceback and once by the verdict's summary line
    # (its source line aside): not again by the wrapping error or by each skipped test
    assert out.count("no weights in /nowhere") == 3, out
    failures = report["failures"]
    assert isinstance(failures, list) and "no weights in /nowhere" in failures[0]["message"]


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("no_such_module_xyz:build", "cannot import 'no_such_module_xyz'"),
        ("fakeengines:not_an_engine", "expected an object with run() and reset()"),
        ("fakeengines:no_such_attr", "has no attribute 'no_such_attr'"),
    ],
)
def test_an_engine_that_cannot_be_loaded_is_one_error(
    pytester: pytest.Pytester, spec: str, needle: str
) -> None:
    with_fakes(pytester)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", f"--prefixcache-engine={spec}", *_args()
    )  # fmt: skip
    _one_error(result, pytester.path, needle)


def test_a_server_that_does_not_exist_is_one_error(
    pytester: pytest.Pytester, server_env: None
) -> None:
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify",
        "--prefixcache-server-cmd=no-such-server-binary-xyz --port {port}", *_args(),
    )  # fmt: skip
    _one_error(result, pytester.path, "cannot start the server 'no-such-server-binary-xyz")
    assert "No such file or directory" in result.stdout.str()


def test_a_server_that_exits_at_once_is_one_error_ending_with_its_log(
    pytester: pytest.Pytester, server_env: None
) -> None:
    pytester.makepyfile(dies="import sys\nprint('model file is corrupt')\nsys.exit(3)\n")
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify",
        "--prefixcache-server-cmd={python} dies.py --port {port}", *_args(),
    )  # fmt: skip
    report = _one_error(result, pytester.path, "exited with 3 before it was ready")
    assert str(report["engine_error"]).rstrip().endswith("model file is corrupt")
    # its whole log outlives the server's HOME, and the error names where
    kept = sorted((pytester.path / ".prefixcache" / "server-logs").glob("server-*.log"))
    assert len(kept) == 1 and "model file is corrupt" in kept[0].read_text()
    assert f"kept at {kept[0]}" in str(report["engine_error"])


def test_a_server_that_stops_cleanly_leaves_no_kept_log(tmp_path: Path) -> None:
    """Negative control: a server stopped by us (or exiting 0) keeps nothing."""
    from pytest_prefixcache.adapters.http.server import KEPT_LOGS, ServerProcess

    script = tmp_path / "ok.py"
    script.write_text(
        "import http.server, sys\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
    )
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        server = ServerProcess(f"{sys.executable} {script} {{port}}", start_timeout=30)
        server.start()
        server.stop()
    finally:
        os.chdir(cwd)
    assert not (tmp_path / KEPT_LOGS).exists()


def test_an_engine_that_builds_is_no_error(pytester: pytest.Pytester) -> None:
    """Positive control: the same options on an engine that builds: no error, exit 0."""
    with_fakes(pytester)
    result = run_suite(pytester, "good", *_args())
    assert result.ret == 0, result.stdout.str()
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["verdict"] == "pass" and report["engine_error"] == ""
    page = render_html(Report.read_json(pytester.path / "r.json"))
    assert '<div id="verdict" class="verdict pass">PASS</div>' in page and "ERROR" not in page


@pytest.mark.parametrize("engine", ["good", "badengine:build"])
def test_prefixcache_html_writes_the_page_and_prints_its_path(
    pytester: pytest.Pytester, engine: str
) -> None:
    """``--prefixcache-html`` (the quickstart's): the page of the run, its path printed last;
    an engine that cannot be built gets its page too, saying ERROR."""
    with_fakes(pytester)
    pytester.makepyfile(badengine=FACTORY)
    if engine == "good":
        result = run_suite(pytester, engine, *_args("--prefixcache-html=out/page.html"))
    else:
        result = pytester.runpytest(
            "-p", "no:cacheprovider", "--prefixcache-verify", f"--prefixcache-engine={engine}",
            *_args("--prefixcache-html=out/page.html"),
        )  # fmt: skip
    page = pytester.path / "out" / "page.html"
    assert f"HTML report written to {page}" in result.stdout.str()
    verdict = 'pass">PASS' if engine == "good" else 'fail">ERROR: the engine could not be built'
    assert f'<div id="verdict" class="verdict {verdict}' in page.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "engine",
    [
        "--prefixcache-engine=badengine:build",
        # each worker's message names its own port: still one error
        "--prefixcache-server-cmd=no-such-server-binary-xyz --port {port}",
    ],
)
def test_under_xdist_each_worker_s_error_is_shown_once(
    pytester: pytest.Pytester, engine: str
) -> None:
    """Every xdist worker builds its own engine: the error from the second worker is
    reported as a skip, so the run still shows one error."""
    pytest.importorskip("xdist")
    pytester.makepyfile(badengine=FACTORY)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--prefixcache-verify", engine, "-n", "2", *_args()
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 2, out
    assert out.count("ERROR at setup") == 1, out
    suite = ET.parse(pytester.path / "j.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1" and suite.get("failures") == "0"
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["verdict"] == "error" and len(report["failures"]) == 1


def test_prefixcache_verify_with_a_missing_server_exits_2_and_leaves_no_temp_home(
    tmp_path: Path,
) -> None:
    """The command, with TMPDIR an empty directory: one error, exit 2, every report says
    ERROR, and the server's private HOME is gone (the binary never started)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "HF_HUB_OFFLINE": "1"}
    env.pop("PREFIXCACHE_TESTS_TMPDIR", None)
    res = subprocess.run(
        [
            sys.executable, "-m", "pytest_prefixcache.cli", "verify",
            "--server-cmd", "no-such-server-binary-xyz --port {port}", "--database", "none",
            "--out", str(tmp_path / "out"),
        ],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout.count("ERROR at setup") == 1, res.stdout
    assert "cannot start the server 'no-such-server-binary-xyz" in res.stderr
    page = (tmp_path / "out" / "report.html").read_text()
    assert "ERROR: the engine could not be built" in page
    left = [p.name for p in temp.iterdir() if p.name.startswith("prefixcache")]
    assert left == [], left
