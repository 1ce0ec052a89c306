"""Reports and replay commands name the engine actually built: a conftest.py override is
named, a conflict with an explicit engine option is a usage error, server-command runs replay
the same command, and ``prefixcache verify`` reads none of the project's pytest
configuration (neither its ini nor its conftest.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from plugin_support import with_fakes
from test_cli import FAST, prefixcache, workdir  # noqa: F401  (a fixture)

from pytest_prefixcache.session.settings import Settings

pytest_plugins = ["pytester"]

CONFTEST = """
import pytest
import fakeengines


@pytest.fixture(scope="session")
def prefixcache_engine():
    return fakeengines.FakeEngine({flags})
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-examples=5",
        "--prefixcache-seed=1", "-k", "request_streams", *args,
    )  # fmt: skip


def test_a_conftest_engine_is_named_in_the_report(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makeconftest(CONFTEST.format(flags=""))
    result = run(pytester, "--prefixcache-report=r.json")
    result.assert_outcomes(passed=1)
    line = "fakeengines.FakeEngine (the prefixcache_engine fixture of conftest.py)"
    result.stdout.fnmatch_lines([f"engine: {line}; tolerance: exact"])
    assert json.loads((pytester.path / "r.json").read_text())["engine"] == line


def test_an_engine_option_that_a_conftest_fixture_would_beat_is_a_usage_error(
    pytester: pytest.Pytester,
) -> None:
    with_fakes(pytester)
    pytester.makeconftest(CONFTEST.format(flags="bad_merge=True"))
    result = run(pytester, "--prefixcache-engine=fakeengines:good")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(
        [
            "*--prefixcache-engine names the engine (fakeengines:good), but a "
            "prefixcache_engine fixture (in conftest.py) builds another "
            "(fakeengines.FakeEngine), and the fixture would win: remove the option, or the "
            "fixture*"
        ]
    )


def test_a_server_command_run_replays_the_same_server() -> None:
    cmd = "python -m reference_engine.server --port {port}"
    s = Settings(engine="x:y", engine_source="--prefixcache-server-cmd", server_cmd=cmd)
    assert s.replay_command("f/stream.json") == (
        f"{sys.executable} -m pytest --prefixcache-verify '--prefixcache-server-cmd=python -m "
        "reference_engine.server --port {port}' --prefixcache-replay=f/stream.json"
    )
    assert "--prefixcache-server-cmd" not in Settings().replay_command("f/stream.json")


@pytest.mark.slow
def test_prefixcache_verify_reads_no_project_configuration(workdir: Path) -> None:  # noqa: F811
    """A conftest.py fixture and an ini engine in the project: both ignored by the gate."""
    (workdir / "conftest.py").write_text(CONFTEST.format(flags="bad_merge=True"), encoding="utf-8")
    (workdir / "pytest.ini").write_text(
        "[pytest]\nprefixcache_engine = fakeengines:ignore_digest\n", encoding="utf-8"
    )
    res = prefixcache(
        workdir, "verify", "--engine", "fakeengines:good", *FAST, "--", "-k", "request_streams"
    )
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads((workdir / "prefixcache-report" / "report.json").read_text())
    assert report["engine"] == "fakeengines:good" and report["verdict"] == "pass"
