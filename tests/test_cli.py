"""The ``prefixcache`` command: verify / replay / report, the files they write and the exit
codes (0 passed, 1 verification failed, 2 usage or engine-load error)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_support import ENGINES_SOURCE

from pytest_prefixcache.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "fakeengines.py").write_text(ENGINES_SOURCE, encoding="utf-8")
    return tmp_path


def prefixcache(
    cwd: Path, *args: str, timeout: float = 600, module: str = "pytest_prefixcache.cli", **env: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1", **env}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


FAST = ("--examples", "5", "--seed", "1", "--database", "none")


def test_verify_passes_and_writes_every_report(workdir: Path) -> None:
    res = prefixcache(workdir, "verify", "--engine", "fakeengines:good", *FAST, "--out", "out")
    assert res.returncode == EXIT_OK, res.stdout + res.stderr
    out = workdir / "out"
    report = json.loads((out / "report.json").read_text())
    assert report["engine"] == "fakeengines:good" and report["requests"] > 0
    assert report["failures"] == [] and report["seed"] == 1
    junit = (out / "junit.xml").read_text()
    assert "<testsuite" in junit and 'failures="0"' in junit
    html = (out / "report.html").read_text()
    assert "fakeengines:good" in html and 'id="chart-reuse"' in html
    assert f"HTML report written to {out / 'report.html'}" in res.stdout


@pytest.mark.slow
def test_verify_failure_exits_1_and_replay_reproduces_it(workdir: Path) -> None:
    res = prefixcache(
        workdir, "verify", "--engine", "fakeengines:ignore_digest", *FAST[:-2], "--examples", "30",
        "--", "-k", "request_streams",
    )  # fmt: skip
    assert res.returncode == EXIT_FAILED, res.stdout + res.stderr
    report = json.loads((workdir / "prefixcache-report" / "report.json").read_text())
    (failure,) = report["failures"]
    assert failure["check"] == "equivalence"
    html = (workdir / "prefixcache-report" / "report.html").read_text()
    assert 'class="failure' in html and "data:image/png;base64," in html
    stream = Path(failure["stream_dir"]) / "stream.json"
    assert stream.is_file()
    assert stream.parent.parent == workdir / "prefixcache-report" / "failures"
    assert Path(report["run_file"]).parent == stream.parent.parent  # the run file beside it
    assert "--prefixcache-engine=fakeengines:ignore_digest" in report["run"]["flags"]
    pasted = subprocess.run(
        ["/bin/sh", "-c", failure["replay"]], cwd=workdir, capture_output=True, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("PREFIXCACHE_")},
        timeout=600,
    )  # fmt: skip
    assert pasted.returncode == EXIT_FAILED and "1 failed" in pasted.stdout, pasted.stdout

    bad = prefixcache(workdir, "replay", str(stream), "--engine", "fakeengines:ignore_digest")
    assert bad.returncode == EXIT_FAILED, bad.stdout + bad.stderr
    assert "1 failed" in bad.stdout
    good = prefixcache(workdir, "replay", str(stream), "--engine", "fakeengines:good")
    assert good.returncode == EXIT_OK, good.stdout + good.stderr
    assert "1 passed" in good.stdout


def test_engine_that_cannot_load_exits_2(workdir: Path) -> None:
    res = prefixcache(workdir, "verify", "--engine", "fakeengines:not_an_engine", *FAST)
    assert res.returncode == EXIT_USAGE, res.stdout + res.stderr
    assert "the engine could not be loaded" in res.stderr
    assert "fakeengines:not_an_engine" in res.stderr
    report = json.loads((workdir / "prefixcache-report" / "report.json").read_text())
    assert "not_an_engine" in report["engine_error"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("verify", "--engine", "no colon"), "is not MODULE:ATTR"),
        (("verify", "--examples", "0"), "'0' is not a positive integer"),
        (("verify", "--engine", "a:b", "--server-cmd", "srv --port {port}"), "both name"),
        (("replay", "missing/stream.json"), "missing/stream.json: no such file"),
        (("report", "missing.json"), "missing.json: cannot read the report"),
        (("frobnicate",), "invalid choice"),
    ],
)
def test_usage_errors_exit_2(workdir: Path, args: tuple[str, ...], message: str) -> None:
    res = prefixcache(workdir, *args, timeout=120)
    assert res.returncode == EXIT_USAGE, res.stdout + res.stderr
    assert message in res.stderr


def test_report_renders_html_and_rejects_a_malformed_file(workdir: Path) -> None:
    from pytest_prefixcache.output.report import Report

    Report(seed=3, engine="m:e", requests=2, cache_hits=1).write_json(workdir / "r.json")
    res = prefixcache(workdir, "report", "r.json", "-o", "page.html", timeout=120)
    assert res.returncode == EXIT_OK, res.stderr
    assert "m:e" in (workdir / "page.html").read_text()
    (workdir / "bad.json").write_text('{"no": "requests"}')
    res = prefixcache(workdir, "report", "bad.json", timeout=120)
    assert res.returncode == EXIT_USAGE
    assert "bad.json" in res.stderr and "not a pytest-prefixcache report" in res.stderr


@pytest.mark.slow
def test_verify_on_two_workers(workdir: Path) -> None:
    pytest.importorskip("xdist", reason="pytest-xdist is not installed (dev extra)")
    res = prefixcache(workdir, "verify", "--engine", "fakeengines:good", *FAST, "--workers", "2")
    assert res.returncode == EXIT_OK, res.stdout + res.stderr
    report = json.loads((workdir / "prefixcache-report" / "report.json").read_text())
    assert report["workers"] == 2 and report["shards"] == 2


def test_verify_puts_pytests_basetemp_in_the_directory_it_removes(tmp_path: Path) -> None:
    from pytest_prefixcache.cli import _parser, _pytest_args

    ini = tmp_path / "removed" / "pytest.ini"
    args = _pytest_args(_parser().parse_args(["verify", "--workers", "2"]), tmp_path, ini)
    assert args[args.index("--basetemp") + 1] == str(ini.parent / "basetemp")
    # a user's own --basetemp (after --) comes later, so pytest takes it
    own = _pytest_args(_parser().parse_args(["verify", "--", "--basetemp", "mine"]), tmp_path, ini)
    assert own[-2:] == ["--basetemp", "mine"] and own.index("--basetemp") < len(own) - 2


@pytest.mark.slow
def test_verify_on_two_workers_leaves_nothing_in_the_temp_directory(workdir: Path) -> None:
    pytest.importorskip("xdist", reason="pytest-xdist is not installed (dev extra)")
    tmp = workdir / "tmp"
    tmp.mkdir()
    args = ("--engine", "fakeengines:good", *FAST, "--workers", "2")
    res = prefixcache(workdir, "verify", *args, TMPDIR=str(tmp))
    assert res.returncode == EXIT_OK, res.stdout + res.stderr
    assert sorted(p.name for p in tmp.iterdir() if p.name != "mlx") == []
    # negative control: the same run through pytest itself leaves pytest's basetemp there
    plain = ("--pyargs", "pytest_prefixcache.suite", "--prefixcache-verify", "--noconftest")
    plain += ("--prefixcache-engine=fakeengines:good", "--prefixcache-examples=5", "-n", "2")
    res = prefixcache(workdir, *plain, module="pytest", TMPDIR=str(tmp))
    assert res.returncode == 0, res.stdout + res.stderr
    assert [p.name for p in tmp.iterdir() if p.name.startswith("pytest-of-")]


def test_replay_of_a_malformed_file_is_a_usage_error(workdir: Path) -> None:
    (workdir / "bad.json").write_text('{"format": "pytest-prefixcache/stream/v1"}')
    res = prefixcache(workdir, "replay", "bad.json", "--engine", "fakeengines:good")
    assert res.returncode == EXIT_USAGE, res.stdout + res.stderr
    assert "bad.json" in res.stderr and "requests" in res.stderr
