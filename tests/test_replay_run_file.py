"""A replay that replays (issue 32, item 5): a run's settings go into a run file beside its
saved streams and into report.json and the HTML page, and the replay line it prints, pasted
into a clean shell (no PREFIXCACHE_* variable set), reproduces the failure."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from plugin_support import with_fakes

import pytest_prefixcache
from pytest_prefixcache import cli
from pytest_prefixcache.errors import PrefixCacheError
from pytest_prefixcache.html import render_html
from pytest_prefixcache.output.report import Report
from pytest_prefixcache.output.run_file import (
    FORMAT,
    RunFile,
    load_run_file,
    package_version,
    recorded_environment,
    split_environment,
    write_run_file,
)
from pytest_prefixcache.session.settings import Settings

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent
STUB = HERE / "stub_openai.py"
#: Where this checkout's package is (a replay's interpreter must import this one, not an
#: installed copy of another checkout).
SOURCE = str(Path(pytest_prefixcache.__file__).resolve().parent.parent)

#: A fake engine whose bug an environment variable picks (none: the correct engine).
ENV_ENGINE = """
import os
import fakeengines

def build():
    bug = os.environ.get("PREFIXCACHE_FAKE_BUG", "")
    return getattr(fakeengines, bug)() if bug else fakeengines.good()
"""


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """A clean shell's environment (``env -i PATH=... HOME=...``): no PREFIXCACHE_* and no
    offline variable; PYTHONPATH only to import this checkout."""
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "TMPDIR": os.environ.get("TMPDIR", str(tmp)), "PYTHONPATH": SOURCE,
            "PYTHONDONTWRITEBYTECODE": "1", **extra}  # fmt: skip


def in_shell(line: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``line`` as pasted into ``/bin/sh``."""
    return subprocess.run(
        ["/bin/sh", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def _report(directory: Path, name: str = "prefixcache-report/report.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / name).read_text(encoding="utf-8"))
    return data


# ---- the run file ------------------------------------------------------------------------


def test_the_run_file_keeps_the_settings_variables_and_no_others() -> None:
    environ = {
        "PREFIXCACHE_COLD": "salt", "SEED_ENGINE": "rapid-mlx", "SEED_FLAGS": "--mllm",
        "OMLX_FLAGS": "-x", "VLLM_PYTHON": "/v/python", "APC_ENABLED": "1",
        "HF_HUB_OFFLINE": "1", "PATH": "/bin", "HOME": "/h", "STUB_FAULT": "corrupt",
        "MY_PREFIXCACHE_X": "1", "HF_HUB_OFFLINE_2": "1",
    }  # fmt: skip
    assert recorded_environment(environ) == {
        "APC_ENABLED": "1", "HF_HUB_OFFLINE": "1", "OMLX_FLAGS": "-x", "PREFIXCACHE_COLD": "salt",
        "SEED_ENGINE": "rapid-mlx", "SEED_FLAGS": "--mllm", "VLLM_PYTHON": "/v/python",
    }  # fmt: skip


def test_a_variable_that_may_hold_a_credential_is_named_not_written(tmp_path: Path) -> None:
    env = {
        "PREFIXCACHE_DATABASE": "redis://:pw@host:6379/0", "PREFIXCACHE_SERVER_ENV": "HF_TOKEN=t",
        "PREFIXCACHE_SERVER_URL": "http://user:pw@127.0.0.1:8000", "SEED_API_KEY": "k",
        "PREFIXCACHE_IMAGE_TOKEN_ID": "262", "PREFIXCACHE_SERVER_CMD": "x --port {port}",
    }  # fmt: skip
    kept, withheld = split_environment(env)
    assert kept == {
        "PREFIXCACHE_IMAGE_TOKEN_ID": "262", "PREFIXCACHE_SERVER_CMD": "x --port {port}"
    }  # fmt: skip
    assert withheld == ("PREFIXCACHE_DATABASE", "PREFIXCACHE_SERVER_ENV",
                        "PREFIXCACHE_SERVER_URL", "SEED_API_KEY")  # fmt: skip
    path = write_run_file(RunFile(("--prefixcache-verify",), kept, withheld), tmp_path)
    assert "pw" not in path.read_text() and load_run_file(path).withheld == withheld


def test_a_run_file_is_written_once_and_named_by_its_content(tmp_path: Path) -> None:
    run = RunFile(("--prefixcache-verify", "--prefixcache-engine=m:f"), {"PREFIXCACHE_A": "1"},
                  python=sys.executable, version=package_version(), seed=3)  # fmt: skip
    first = write_run_file(run, tmp_path)
    assert write_run_file(run, tmp_path) == first and first.name.startswith("run-")
    assert load_run_file(first) == run
    assert json.loads(first.read_text())["format"] == FORMAT
    other = write_run_file(RunFile(run.flags, {"PREFIXCACHE_A": "2"}), tmp_path)
    assert other != first  # another run's settings never overwrite this one's
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, other.name])


GOOD = {"format": FORMAT, "flags": ["--prefixcache-verify"], "environment": {}}
BAD: list[tuple[str, Any, str]] = [
    ("not-json", "{", "is not valid JSON"),
    ("array", [1], "is [1], expected a JSON object"),
    ("format", {**GOOD, "format": "x"}, "format is 'x', expected 'pytest-prefixcache/run/v1'"),
    ("flags", {**GOOD, "flags": "--prefixcache-verify"}, "flags: is '--prefixcache-verify'"),
    ("flag", {**GOOD, "flags": ["-k", "x"]}, "flags: '-k' is not a --prefixcache-* option"),
    ("env-name", {**GOOD, "environment": {"PATH": "/x"}}, "environment: 'PATH' is not a var"),
    ("env-value", {**GOOD, "environment": {"PREFIXCACHE_A": 1}}, "environment: is"),
    ("seed", {**GOOD, "seed": "1"}, "seed: is '1', expected an integer"),
    ("withheld", {**GOOD, "withheld": ["HOME"]}, "withheld: 'HOME' is not a variable"),
]


@pytest.mark.parametrize(("name", "content", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_run_file_is_refused_naming_the_file_and_the_field(
    tmp_path: Path, name: str, content: Any, message: str
) -> None:
    path = tmp_path / f"{name}.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(PrefixCacheError) as err:
        load_run_file(path)
    assert str(path) in str(err.value) and message in str(err.value)
    load_run_file(_write(tmp_path / "good.json", GOOD))  # the control: a good one loads


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_a_missing_or_bad_run_file_or_a_second_engine_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    stream = tmp_path / "stream.json"
    stream.write_text('{"format": "pytest-prefixcache/stream/v1", "requests": []}')
    assert cli.main(["replay", "--run", "nope.json", str(stream)]) == cli.EXIT_USAGE
    assert "cannot read run file 'nope.json': No such file or directory" in capsys.readouterr().err
    assert cli.main(["replay", "--run", str(tmp_path), str(stream)]) == cli.EXIT_USAGE
    assert "is a directory, not a run-*.json file" in capsys.readouterr().err
    bad = _write(tmp_path / "bad.json", {**GOOD, "flags": ["--x"]})
    assert cli.main(["replay", "--run", str(bad), str(stream)]) == cli.EXIT_USAGE
    assert f"run file '{bad}': flags: '--x' is not a --prefixcache-* option" in (
        capsys.readouterr().err
    )
    good = _write(tmp_path / "good.json", GOOD)
    code = cli.main(["replay", "--run", str(good), "--engine", "m:f", str(stream)])
    assert code == cli.EXIT_USAGE
    assert "names the engine (its flags: --prefixcache-verify); drop --engine" in (
        capsys.readouterr().err
    )


def test_the_replay_line_names_the_run_file_and_the_interpreter(tmp_path: Path) -> None:
    s = Settings(engine="m:f", engine_source="option", invocation_dir=tmp_path)
    stream = tmp_path / "f" / "abc" / "stream.json"
    python = shlex.quote(sys.executable)
    assert s.replay_command(str(stream), tmp_path / "f" / "run-1.json") == (
        f"{python} -m pytest_prefixcache.cli replay --run=f/run-1.json f/abc/stream.json"
    )
    assert s.replay_command(str(stream)) == (  # no run file (a conftest.py engine)
        f"{python} -m pytest --prefixcache-verify --prefixcache-engine=m:f "
        "--prefixcache-replay=f/abc/stream.json"
    )


def test_an_engine_named_in_the_ini_file_is_named_in_the_run_file(
    pytester: pytest.Pytester,
) -> None:
    """``prefixcache replay`` reads no ini file: the run file names the ini's engine."""
    with_fakes(pytester)
    pytester.makeini("[pytest]\nprefixcache_engine = fakeengines:lie\n")
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-examples=5",
        "--prefixcache-seed=1", "-k", "request_streams", "--prefixcache-report=r.json",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    run = _report(pytester.path, "r.json")["run"]
    assert run["flags"] == ["--prefixcache-verify", "--prefixcache-engine=fakeengines:lie"]


# ---- end to end: the printed line in a clean shell ----------------------------------------


def test_an_in_process_failure_replays_from_a_clean_shell(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A planted bug picked by a PREFIXCACHE_* variable: the printed line reproduces it with no
    variable set; without the run file's settings the same stream passes (negative controls)."""
    with_fakes(pytester)
    pytester.makepyfile(envengine=ENV_ENGINE)
    monkeypatch.setenv("PREFIXCACHE_FAKE_BUG", "ignore_digest")
    monkeypatch.setenv("PREFIXCACHE_DATABASE", "none")  # withheld: it may hold a password
    first = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-engine=envengine:build",
        "--prefixcache-examples=30", "--prefixcache-seed=1", "-k", "request_streams",
        "--prefixcache-report=r.json", "--junitxml=j.xml", timeout=600,
    )  # fmt: skip
    assert first.ret == 1, first.stdout.str()
    report = _report(pytester.path, "r.json")
    junit = ElementTree.parse(pytester.path / "j.xml").getroot()
    props = {p.get("name"): p.get("value") for p in junit.iter("property")}
    assert props["prefixcache_run_file"] == report["run_file"]
    [failure] = report["failures"]
    line, run = failure["replay"], report["run"]
    assert f"  replay: {line}" in first.stdout.lines and line.startswith(
        f"{shlex.quote(sys.executable)} -m pytest_prefixcache.cli replay --run=.prefixcache/"
    )
    assert run["environment"]["PREFIXCACHE_FAKE_BUG"] == "ignore_digest"
    assert run["withheld"] == ["PREFIXCACHE_DATABASE"]
    assert "PREFIXCACHE_DATABASE" not in run["environment"]
    assert (run["python"], run["version"], run["tolerance"]) == (
        sys.executable, package_version(), "exact"
    )  # fmt: skip
    assert load_run_file(report["run_file"]).to_json() == run
    html = render_html(Report.from_json(report))
    assert 'id="run"' in html and "PREFIXCACHE_FAKE_BUG" in html and report["run_file"] in html

    env = clean_env(tmp_path)
    again = in_shell(line, pytester.path, env)
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-2000:]
    assert "EquivalenceFailure: equivalence:" in again.stdout
    assert "the run had PREFIXCACHE_DATABASE, which a run file does not keep" in again.stdout
    assert _report(pytester.path)["failures"][0]["check"] == failure["check"] == "equivalence"

    stream = line.split()[-1]  # negative control 1: the run's flags, this shell's environment
    flags = shlex.join(run["flags"])
    old = in_shell(f"{sys.executable} -m pytest {flags} --prefixcache-replay={stream}",
                   pytester.path, env)  # fmt: skip
    assert old.returncode == 0 and "1 passed" in old.stdout, old.stdout[-3000:]
    emptied = {**run, "environment": {}}  # 2: the run file without its environment
    path = pytester.path / "emptied.json"
    path.write_text(json.dumps(emptied))
    bare = in_shell(line.replace(line.split()[-2], f"--run={path}"), pytester.path,
                    {**env, "PREFIXCACHE_FAKE_BUG": "ignore_digest"})  # fmt: skip
    assert bare.returncode == 0, bare.stdout[-3000:]
    assert "unset from this shell: PREFIXCACHE_FAKE_BUG" in bare.stdout  # the file decides


VLLM_ENV = {
    "PREFIXCACHE_COLD": "salt",
    "PREFIXCACHE_NAMESPACE_FIELD": "cache_salt",
    "PREFIXCACHE_PROMPT_IDS": "reply",
    "PREFIXCACHE_RESET_PATHS": "POST /reset_prefix_cache,POST /reset_mm_cache",
}


@pytest.mark.slow  # three server sessions: about 13 s on 2 shared cores
def test_a_server_failure_replays_from_a_clean_shell(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A vLLM-shaped server whose cache ignores the salt: its salted cold baseline reports
    reuse, which only the run's PREFIXCACHE_* settings (cold by salt, ids from the reply) show.
    The printed line reproduces that fault from a clean shell; the same stream and server
    command without the settings does not (negative control)."""
    monkeypatch.delenv("STUB_FAULT", raising=False)
    for k, v in VLLM_ENV.items():
        monkeypatch.setenv(k, v)
    cmd = f"{{python}} {STUB} --flavour vllm --fault ignores_salt --port {{port}}"
    body = '{"return_tokens_as_token_ids": true}'
    first = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-allow-partial",
        f"--prefixcache-server-cmd={cmd}", f"--prefixcache-server-body={body}",
        "--prefixcache-examples=3", "--prefixcache-seed=1", "-k", "request_streams",
        "--prefixcache-report=r.json", timeout=600,
    )  # fmt: skip
    assert first.ret == 1, first.stdout.str()
    report = _report(pytester.path, "r.json")
    [failure] = report["failures"]
    assert failure["check"] == "fault" and "uncached baseline reported" in failure["message"]
    assert VLLM_ENV.items() <= report["run"]["environment"].items()
    assert report["run"]["server_cmd"] == cmd

    env = clean_env(tmp_path)
    again = in_shell(failure["replay"], pytester.path, env)
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-2000:]
    assert "the uncached baseline reported cached_tokens=" in again.stdout
    assert _report(pytester.path)["failures"][0]["check"] == "fault"

    stream = failure["replay"].split()[-1]  # without the run file: the issue's replay line
    args = [f"--server-cmd={cmd}", f"--server-body={body}", stream]
    bare = in_shell(f"{sys.executable} -m pytest_prefixcache.cli replay {shlex.join(args)}",
                    pytester.path, env)  # fmt: skip
    rep = _report(pytester.path)
    assert rep["failures"] == [] and rep["verdict"] == "incomplete", bare.stdout[-3000:]


@pytest.mark.slow  # the reference engine's mutant on a corpus scenario: about 45 s on 2 cores
def test_a_mutant_of_the_reference_engine_replays_from_a_clean_shell(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """The README's caught bug (placeholder_collision, one corpus scenario): the printed line
    reproduces it with no variable set; the stream without the run file replays against the
    default engine, which passes (negative control)."""
    pytest.importorskip("mlx.core")
    first = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--prefixcache-verify",
        "--prefixcache-engine=reference_engine.mutants:placeholder_collision",
        "--prefixcache-seed=1", "-k", "three_images_red_blue_green",
        "--prefixcache-report=r.json", timeout=600,
    )  # fmt: skip
    assert first.ret == 1, first.stdout.str()
    [failure] = _report(pytester.path, "r.json")["failures"]
    again = in_shell(failure["replay"], pytester.path, clean_env(tmp_path))
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-2000:]
    assert _report(pytester.path)["failures"][0]["check"] == failure["check"] == "equivalence"
    stream = failure["replay"].split()[-1]
    bare = in_shell(f"{sys.executable} -m pytest_prefixcache.cli replay {stream}",
                    pytester.path, clean_env(tmp_path, HF_HUB_OFFLINE="1"))  # fmt: skip
    assert bare.returncode == 0 and "1 passed" in bare.stdout, bare.stdout[-3000:]


def test_a_run_file_written_by_hand_configures_a_verify_run(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """The run file is also the form a CI job keeps its settings in: ``prefixcache verify
    --run FORM`` in a clean shell runs the engine and variables the form names, and its
    failure's printed line replays it; the same command with the form's flags but without its
    environment passes (negative control)."""
    with_fakes(pytester)
    pytester.makepyfile(envengine=ENV_ENGINE)
    form = {"format": FORMAT, "flags": ["--prefixcache-engine=envengine:build"],
            "environment": {"PREFIXCACHE_FAKE_BUG": "ignore_digest"}}  # fmt: skip
    _write(pytester.path / "form.json", form)
    env = clean_env(tmp_path)
    verify = f"{sys.executable} -m pytest_prefixcache.cli verify --examples 10 --seed 1 " + (
        "--database none {} -- -k request_streams"
    )
    res = in_shell(verify.format("--run form.json"), pytester.path, env)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-2000:]
    [failure] = _report(pytester.path)["failures"]
    assert _report(pytester.path)["run"]["environment"] == form["environment"]
    again = in_shell(failure["replay"], pytester.path, env)
    assert again.returncode == 1 and "EquivalenceFailure" in again.stdout, again.stdout[-3000:]
    bare = in_shell(verify.format("--engine envengine:build"), pytester.path, env)
    assert bare.returncode == 0, bare.stdout[-3000:]
