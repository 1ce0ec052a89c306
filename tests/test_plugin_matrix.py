"""Several engine configurations in one run (the matrix): repeated engine flags and a matrix
file, each configuration its own parametrized tests, engine, report row and verdict; the
session verdict and exit code the worst; xdist runs a whole configuration on one worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
from plugin_support import with_fakes

from pytest_prefixcache import cli
from pytest_prefixcache.session.matrix_file import MatrixError, read_matrix

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
STUB = Path(__file__).with_name("stub_openai.py")
CASE = ROOT / "fixtures" / "corpus" / "mutants" / "mutant_placeholder_collision.json"
#: A factory that takes the matrix's flags: ``--lie`` builds a fake that over-reports reuse.
FLAGGED = """
from fakeengines import FakeEngine

def build(flags, tag="none"):
    print("built", tag, flags)
    return FakeEngine(**{f.lstrip("-").replace("-", "_"): True for f in flags})

def no_flags():
    return FakeEngine()
"""
FAKES_MATRIX = """
[defaults]
examples = 3

[[config]]
name = "fake"
engine = "flagged:build"
args = { tag = "t1" }
[config.flags]
reuse = { honest = "", broken = "--lie" }

[[config]]
name = "plain"
engine = "fakeengines:good"
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(Path(__file__).parent), env.get("PYTHONPATH", "")]
    )
    return env


def _fakes(pytester: pytest.Pytester) -> pytest.Pytester:
    with_fakes(pytester)
    pytester.makepyfile(flagged=FLAGGED)
    pytester.path.joinpath("m.toml").write_text(FAKES_MATRIX, encoding="utf-8")
    return pytester


def _rows(report: dict) -> dict[str, str]:
    return {row["name"]: row["verdict"] for row in report["configs"]}


@pytest.mark.slow
def test_reference_engine_and_a_mutant_get_a_row_each(tmp_path: Path) -> None:
    """The real reference engine and one of its mutants replaying the mutant's saved case: one
    PASS row, one FAIL row, exit 1, each configuration's counters in report.json, and the
    replay command names the mutant alone."""
    pytest.importorskip("mlx.core")
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
        "--prefixcache-verify", "--prefixcache-report=r.json",
        "--prefixcache-engine=reference=reference_engine:default_engine",
        "--prefixcache-engine=reference_engine.mutants:placeholder_collision",
        f"--prefixcache-replay={CASE}", "--prefixcache-failures-dir=f", "-q",
    ]  # fmt: skip
    res = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"] == "fail"
    assert _rows(report) == {"reference": "pass", "placeholder_collision": "fail"}
    ref, mutant = report["configs"]
    assert ref["engine"] == "reference_engine:default_engine" and ref["requests"] > 0
    assert ref["failures"] == [] and mutant["failures_by_check"] == {"equivalence": 1}
    assert report["requests"] == ref["requests"] + mutant["requests"]
    assert "test_replay[reference] PASSED" in out or "1 failed, 1 passed" in out
    assert f"--run=f/{Path(mutant['run_file']).name} " in mutant["failures"][0]["replay"]
    flags = mutant["run"]["flags"]  # the replay names the mutant alone
    assert "--prefixcache-engine=reference_engine.mutants:placeholder_collision" in flags
    assert not any("default_engine" in f for f in flags)
    assert "  reference              PASS" in res.stdout
    assert "  placeholder_collision  FAIL" in res.stdout


def test_a_matrix_file_parametrizes_the_suite_by_configuration(pytester: pytest.Pytester) -> None:
    """A factory's flag product (one honest, one broken combination) and a plain engine: the
    test ids carry the configuration, items run one configuration after another, each
    configuration's engine is built with its args and flags, and the verdicts are its own."""
    _fakes(pytester)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-matrix=m.toml",
        "--prefixcache-seed=1", "--prefixcache-database=none", "--prefixcache-report=r.json",
        "--junitxml=j.xml", "-v", "-s", "-k", "request_streams or corpus",
    )  # fmt: skip
    ran = [ln.split("::")[1].split(" ")[0] for ln in result.outlines if ln.startswith("verif")]
    assert "test_request_streams[fake[honest]]" in ran and "test_request_streams[plain]" in ran
    assert any(t.startswith("test_corpus[") and t.endswith("-fake[broken]]") for t in ran)
    names = ("fake[honest]", "fake[broken]", "plain")
    configs = [next(n for n in names if t.endswith(f"{n}]")) for t in ran]
    runs = [c for i, c in enumerate(configs) if i == 0 or configs[i - 1] != c]
    assert runs == list(names), configs  # one configuration after another, in file order
    assert "built t1 ['--lie']" in result.outlines and "built t1 []" in result.outlines
    report = json.loads((pytester.path / "r.json").read_text())
    assert _rows(report) == {"fake[honest]": "pass", "fake[broken]": "fail", "plain": "pass"}
    assert report["verdict"] == "fail" and result.ret == 1
    broken = report["configs"][1]
    assert broken["engine"] == "flagged:build(tag='t1', flags=['--lie'])"
    replay = broken["failures"][0]["replay"]
    assert f"--run={Path(broken['run_file']).relative_to(pytester.path)} " in replay
    run = json.loads(Path(broken["run_file"]).read_text())
    assert run == broken["run"] and report["run"] == {}  # one per configuration
    assert run["flags"][1:3] == ["--prefixcache-matrix=m.toml", "--prefixcache-config=fake[broken]"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFIXCACHE_")}
    pasted = subprocess.run(["/bin/sh", "-c", replay], cwd=pytester.path, env=env,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert pasted.returncode == 1 and "ReuseBoundFailure" in pasted.stdout, pasted.stdout[-2000:]
    root = ElementTree.parse(pytester.path / "j.xml").getroot()
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["prefixcache_verdict"] == "fail"
    assert props["prefixcache_verdict[fake[broken]]"] == "fail"
    assert props["prefixcache_verdict[plain]"] == "pass"


def test_config_selects_by_name_or_base_name(pytester: pytest.Pytester) -> None:
    _fakes(pytester)
    base = ("--prefixcache-verify", "--prefixcache-matrix=m.toml", "--collect-only", "-q")
    result = pytester.runpytest(*base, "--prefixcache-config=fake")
    assert any("[fake[broken]]" in line for line in result.outlines)
    assert not any("[plain]" in line for line in result.outlines)
    result = pytester.runpytest(*base, "--prefixcache-config=plain")
    ids = [line for line in result.outlines if "::test_" in line]
    assert ids and all(line.endswith("plain]") for line in ids)
    result = pytester.runpytest(*base, "--prefixcache-config=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        "--prefixcache-config 'nope': no such configuration; the configurations are: "
        "fake[honest], fake[broken], plain"
    ) in result.stdout.str() + result.stderr.str()


def test_a_factory_without_flags_is_that_configurations_error(pytester: pytest.Pytester) -> None:
    """The configuration whose factory takes no ``flags`` errors (its row says ERROR); the
    other configuration still runs and keeps its own verdict."""
    _fakes(pytester)
    pytester.path.joinpath("m.toml").write_text(
        FAKES_MATRIX.replace("flagged:build", "flagged:no_flags").replace(
            'args = { tag = "t1" }', ""
        ),
        encoding="utf-8",
    )
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-matrix=m.toml",
        "--prefixcache-seed=1", "--prefixcache-database=none", "--prefixcache-report=r.json",
        "-k", "request_streams",
    )  # fmt: skip
    report = json.loads((pytester.path / "r.json").read_text())
    assert _rows(report) == {"fake[honest]": "error", "fake[broken]": "error", "plain": "pass"}
    assert "takes no keyword argument 'flags'" in report["configs"][0]["engine_error"]
    assert report["engine_error"].startswith("fake[honest]: ")  # the command exits 2 on it
    assert "  fake[honest]  ERROR      engine could not be built: engine 'flagged:no_flags'" in (
        result.stdout.str()
    )
    assert result.ret == 2  # an engine that could not be built: the session exits 2


@pytest.mark.slow
def test_server_commands_get_each_combination_s_flags(tmp_path: Path) -> None:
    """``prefixcache verify --matrix``: a flag product over a stub server, one combination
    excluded; the stub records the command line of every server started, so each surviving
    combination is seen started with exactly its flags (and none with the excluded one)."""
    log = tmp_path / "argv.jsonl"
    env = {
        "PREFIXCACHE_COLD": "salt", "PREFIXCACHE_NAMESPACE_FIELD": "cache_salt",
        "PREFIXCACHE_PROMPT_IDS": "reply", "PREFIXCACHE_IMAGE_TOKEN_ID": "262",
        "PREFIXCACHE_RESET_PATHS": "POST /reset_prefix_cache", "STUB_ARGV_LOG": str(log),
    }  # fmt: skip
    table = ", ".join(f'{k} = "{v}"' for k, v in env.items())
    (tmp_path / "m.toml").write_text(
        f"""
[defaults]
examples = 2
server_body = {{ return_tokens_as_token_ids = true }}

[[config]]
name = "stub"
server_cmd = "{sys.executable} {STUB} --flavour vllm --port {{port}}"
env = {{ {table} }}
[config.flags]
batching = {{ simple = "", cb = "--continuous-batching" }}
cache = {{ default = "", paged = "--use-paged-cache --block-size 16" }}
[[config.exclude]]
batching = "simple"
cache = "paged"
""",
        encoding="utf-8",
    )
    res = subprocess.run(
        [sys.executable, "-m", "pytest_prefixcache.cli", "verify", "--matrix", "m.toml",
         "--allow-partial", "--seed", "1", "--database", "none", "--out", "out",
         "--", "-k", "request_streams", "-p", "no:randomly"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    flags = {tuple(a for a in json.loads(line) if a.startswith("--") and a not in (
        "--flavour", "--port")) for line in log.read_text().splitlines()}  # fmt: skip
    assert flags == {
        (),
        ("--continuous-batching",),
        ("--continuous-batching", "--use-paged-cache", "--block-size"),
    }
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    names = ("stub[simple,default]", "stub[cb,default]", "stub[cb,paged]")
    assert _rows(report) == dict.fromkeys(names, "partial")  # partial: no claim sources
    assert "PREFIXCACHE_SERVER_CMD" not in os.environ


BAD = [
    ("", "m.toml: key 'config': no [[config]] tables"),
    ("[[config]\nname = 'a'", "m.toml: not valid TOML: * (at line 1, column 9)"),
    ("colour = 1\n[[config]]\nname='a'\nengine='m:e'", "m.toml: key 'colour': unknown key"),
    ("[[config]]\nname='a'\nengine='m:e'\nexamples=0", "config 'a': key 'examples': 0 is not a"),
    ("[[config]]\nname='a'\nengine='m:e'\nenv={X=1}", "config 'a': key 'env.X': 1 is not a string"),
    ("[[config]]\nname='a'\nengine='m:e'\nspeed=1", "config 'a': key 'speed': unknown key"),
    ("[defaults]\nspeed=1\n[[config]]\nname='a'\nengine='m:e'", "key 'defaults.speed': unknown"),
    ("[[config]]\nname='a'\nengine='m:e'\n[[config]]\nname='a'\nengine='m:f'",
     "config 'a': key 'name': the name is given twice"),
    ("[[config]]\nname='a'", "config 'a': key 'engine': give exactly one of engine and server_cmd"),
    ("[[config]]\nname='a'\nengine='m:e'\nserver_cmd='s {port}'", "give exactly one"),
    ("[[config]]\nname='a b'\nengine='m:e'", "config '#1': key 'name': 'a b' is not a name"),
    ("[[config]]\nname='a'\nengine='m:e'\n[config.flags]\nx={p=''}\n[[config.exclude]]\ny='p'",
     "config 'a': key 'exclude[0]': unknown dimension 'y'"),
    ("[[config]]\nname='a'\nengine='m:e'\n[config.flags]\nx={p=''}\n[[config.exclude]]\nx='q'",
     "config 'a': key 'exclude[0].x': unknown label 'q'"),
    ("[[config]]\nname='a'\nengine='m:e'\n[config.flags]\nx={p=''}\n[[config.exclude]]\nx='p'",
     "config 'a': key 'flags': the product of the flag sets is empty"),
    ("[[config]]\nname='a'\nengine='m:e'\n[config.flags]\nx={}", "key 'flags': the product"),
]  # fmt: skip


def _contains(text: str, pattern: str) -> bool:
    """``pattern``'s parts (split at ``*``) occur in ``text`` in order (brackets literal)."""
    pos = 0
    for part in pattern.split("*"):
        pos = text.find(part, pos)
        if pos < 0:
            return False
        pos += len(part)
    return True


@pytest.mark.parametrize(("text", "message"), BAD, ids=range(len(BAD)))
def test_a_bad_matrix_file_is_a_usage_error_naming_the_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    message: str,
) -> None:
    path = tmp_path / "m.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(MatrixError) as info:
        read_matrix(path)
    assert _contains(str(info.value), message), info.value
    monkeypatch.chdir(tmp_path)  # the command exits 2 with the same words, before running anything
    assert cli.main(["verify", "--matrix", "m.toml", "--out", "out"]) == cli.EXIT_USAGE
    assert _contains(capsys.readouterr().err, message)


def test_a_missing_matrix_file_is_named(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--prefixcache-verify", "--prefixcache-matrix=nope.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*nope.toml: cannot read the matrix file: No such file*"])


def test_flag_configurations_are_named_after_the_spec(pytester: pytest.Pytester) -> None:
    _fakes(pytester)
    result = pytester.runpytest(
        "--prefixcache-verify", "--collect-only", "-q", "-k", "request_streams",
        "--prefixcache-engine=fakeengines:good", "--prefixcache-engine=other:good",
        "--prefixcache-engine=mine=fakeengines:lie",
        f"--prefixcache-server-cmd={sys.executable} {STUB} --port {{port}}",
    )  # fmt: skip
    ids = [line.split("::")[1] for line in result.outlines if "::test_" in line]
    assert ids == [f"test_request_streams[{n}]" for n in ("good", "good-2", "mine", "stub_openai")]


@pytest.mark.slow
def test_xdist_runs_each_configuration_on_one_worker(pytester: pytest.Pytester) -> None:
    """``-n 2`` with two configurations: each configuration's tests all ran on one worker
    (its row merged from one worker), and the verdicts are the serial run's."""
    pytest.importorskip("xdist")
    _fakes(pytester)
    args = (
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-seed=1",
        "--prefixcache-database=none", "--prefixcache-examples=2", "-k", "request_streams",
        "--prefixcache-engine=fakeengines:good", "--prefixcache-engine=fakeengines:lie",
    )  # fmt: skip
    pytester.runpytest(*args, "--prefixcache-report=serial.json")
    result = pytester.runpytest_subprocess(*args, "-n", "2", "--prefixcache-report=x.json")
    serial = json.loads((pytester.path / "serial.json").read_text())
    spread = json.loads((pytester.path / "x.json").read_text())
    assert _rows(spread) == _rows(serial) == {"good": "pass", "lie": "fail"}
    assert [row["workers"] for row in spread["configs"]] == [1, 1], result.outlines[-30:]
    assert spread["workers"] == 2 and serial["workers"] == 0
    for row in spread["configs"]:
        assert len({f["worker"] for f in row["failures"]}) <= 1
    assert result.ret == 1


def test_the_html_page_has_a_row_per_configuration() -> None:
    from pytest_prefixcache.html import render_html
    from pytest_prefixcache.output.report import Report

    rows = [
        {"name": "a[x]", "engine": "m:e", "verdict": "pass", "requests": 3, "cache_hits": 1},
        {"name": "b", "engine": "m:f", "verdict": "error", "engine_error": "no module m"},
    ]
    page = render_html(Report(requests=3, engine="2 configurations: a[x], b", configs=rows))
    assert 'id="configs"' in page and "Configurations (2)" in page
    assert (
        '<code>a[x]</code></td><td class="good">PASS</td><td>m:e</td><td>3</td><td>1</td>' in page
    )
    assert '<td class="bad">ERROR</td>' in page and "engine could not be built: no module m" in page
    assert 'id="verdict" class="verdict fail"' in page  # the worst row's
    assert 'id="configs"' not in render_html(Report(requests=3))


def test_one_configuration_changes_nothing(pytester: pytest.Pytester) -> None:
    """A single --prefixcache-engine (even named) keeps the plain run's ids and report."""
    _fakes(pytester)
    result = pytester.runpytest(
        "--prefixcache-verify", "--collect-only", "-q", "--prefixcache-engine=x=fakeengines:good"
    )
    ids = [line.split("::")[1] for line in result.outlines if "::test_" in line]
    assert "test_request_streams" in ids and not any("good" in i for i in ids)
