"""``--prefixcache-model=NAME|DIR``: which model every engine factory loads.

A fixture folder's name or a directory (relative to the invocation directory; the ini key's to
the ini file, a matrix file's to the file) becomes an absolute path, exported as
``PREFIXCACHE_MODEL`` while the session runs; the header, the summary, the JSON report and
every replay command name it; a value that names neither is a usage error that repeats it and
lists the fixtures. Without it, each engine loads its own fixture.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_support import ENGINES_SOURCE, REPLAY_LINE, run_file, with_fakes

from pytest_prefixcache import EngineError, cli
from pytest_prefixcache.package_data import FIXTURES, MODEL_ENV, resolve_model
from pytest_prefixcache.session import settings
from pytest_prefixcache.session.matrix_file import MatrixError, read_matrix
from pytest_prefixcache.session.stash import SETTINGS_KEY

pytest_plugins = ["pytester"]

LLAMA = str(FIXTURES / "tiny-llama")
QWEN2_VL = str(FIXTURES / "tiny-qwen2-vl")
#: Factories that write what the engine would load to ``built.txt`` (one line per build: the
#: baseline audit builds fresh instances too) and return a fake engine.
RECORDED = """
import os
from fakeengines import FakeEngine

def _note(text):
    with open("built.txt", "a", encoding="utf-8") as fh:
        fh.write(f"{text}\\n")

def build():
    _note(os.environ.get("PREFIXCACHE_MODEL", "<unset>"))
    return FakeEngine()

def build_with(model_dir=None):
    _note(f"arg {model_dir}")
    return FakeEngine()

def reference():
    import reference_engine
    _note(reference_engine.env_model_path())
    return FakeEngine()

def lie():
    return FakeEngine(lie=True)
"""


@pytest.fixture(autouse=True)
def _no_model_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MODEL_ENV, raising=False)


def _recorded(pytester: pytest.Pytester) -> pytest.Pytester:
    with_fakes(pytester)
    pytester.makepyfile(recorded=RECORDED)
    return pytester


def _model_dir(root: Path, name: str = "models/mine") -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}", encoding="utf-8")
    return path


def _vlm_dir(root: Path, name: str = "models/vlm") -> Path:
    """A directory that reads as a vision-language model (its config.json has a vision_config)."""
    path = _model_dir(root, name)
    (path / "config.json").write_text('{"vision_config": {}}', encoding="utf-8")
    return path


def _run(
    pytester: pytest.Pytester,
    *engines: str,
    args: tuple[str, ...] = (),
    examples: int = 1,
    k: str = "request_streams",
    subprocess: bool = False,
) -> pytest.RunResult:
    """The suite's tests ``k`` selects on ``engines`` (``[NAME=]MODULE:ATTR``), seed 1."""
    argv = [
        "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning",
        "--prefixcache-verify", *(f"--prefixcache-engine={e}" for e in engines),
        f"--prefixcache-examples={examples}", "--prefixcache-seed=1",
        "--prefixcache-database=none", "-k", k, *args,
    ]  # fmt: skip
    if subprocess:
        return pytester.runpytest_subprocess(*argv)
    return pytester.runpytest(*argv)


def _built(pytester: pytest.Pytester) -> set[str]:
    return set((pytester.path / "built.txt").read_text(encoding="utf-8").splitlines())


# -- unit: the validator and the one resolution rule -----------------------------------------


def test_a_fixture_name_and_a_relative_directory_resolve_to_absolute_paths(
    tmp_path: Path,
) -> None:
    mine = _model_dir(tmp_path)
    assert settings.model_dir("tiny-llama") == LLAMA
    assert settings.model_dir("models/mine", tmp_path) == str(mine)
    assert resolve_model(str(mine)) == mine  # an absolute directory as it is


@pytest.mark.parametrize(
    ("bad", "why"),
    [("nope", "no such directory"), ("models", "a directory without a config.json")],
)
def test_a_bad_value_repeats_it_and_lists_the_fixtures(tmp_path: Path, bad: str, why: str) -> None:
    (tmp_path / "models").mkdir()
    with pytest.raises(argparse.ArgumentTypeError) as info:
        settings.model_dir(bad, tmp_path)
    says = str(info.value)
    assert says.startswith(f"{bad!r} is not a fixture model (")
    assert "tiny-llama" in says and "tiny-qwen2-vl" in says  # the list grows with the fixtures
    assert says.endswith(f"or a model directory ({str(tmp_path / bad)!r}: {why})")


# -- the option, the ini key and the variable (parseconfigure) ------------------------------


def test_the_option_resolves_and_is_exported(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfigure("--prefixcache-model=tiny-llama")
    s = config.stash[SETTINGS_KEY]
    assert (s.model, s.model_source, s.model_name) == (LLAMA, "option", "tiny-llama")
    assert os.environ[MODEL_ENV] == LLAMA


def test_a_relative_directory_resolves_against_the_invocation_directory(
    pytester: pytest.Pytester,
) -> None:
    mine = _model_dir(pytester.path)
    s = pytester.parseconfigure("--prefixcache-model=models/mine").stash[SETTINGS_KEY]
    assert (s.model, s.model_name) == (str(mine), str(mine))
    assert os.environ[MODEL_ENV] == str(mine)


def test_the_ini_key_resolves_against_the_ini_file(pytester: pytest.Pytester) -> None:
    mine = _model_dir(pytester.path, "sub/models/mine")
    (pytester.path / "sub" / "pytest.ini").write_text("[pytest]\nprefixcache_model = models/mine\n")
    s = pytester.parseconfigure("-c", "sub/pytest.ini").stash[SETTINGS_KEY]
    assert (s.model, s.model_source) == (str(mine), "ini")
    s = pytester.parseconfigure("-c", "sub/pytest.ini", "--prefixcache-model=tiny-llama").stash[
        SETTINGS_KEY
    ]
    assert (s.model, s.model_source) == (LLAMA, "option")  # the command line wins


def test_the_variable_alone_names_the_model(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MODEL_ENV, "tiny-llama")
    s = pytester.parseconfigure().stash[SETTINGS_KEY]
    assert (s.model, s.model_source) == (LLAMA, MODEL_ENV)
    assert os.environ[MODEL_ENV] == LLAMA  # absolute for servers started in their own HOME


def test_a_variable_that_names_no_directory_is_left_to_the_engine(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """presets.from_env sends it as the request's ``model`` field: a served model's name."""
    monkeypatch.setenv(MODEL_ENV, "served-name")
    s = pytester.parseconfigure().stash[SETTINGS_KEY]
    assert (s.model, s.model_source) == (None, "default")
    assert os.environ[MODEL_ENV] == "served-name"


def test_without_the_option_each_engine_keeps_its_own(pytester: pytest.Pytester) -> None:
    """Negative control: no model, nothing exported, no flag in the replay."""
    s = pytester.parseconfigure("--prefixcache-verify").stash[SETTINGS_KEY]
    assert (s.model, s.model_source) == (None, "default")
    assert MODEL_ENV not in os.environ
    assert "--prefixcache-model" not in s.replay_command("x/stream.json")


# -- usage errors ------------------------------------------------------------------------------


def test_a_bad_value_is_a_usage_error_naming_it(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--prefixcache-model=tiny-nothing")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*error: argument --prefixcache-model: 'tiny-nothing' is not a fixture model "
            "(*tiny-llama, tiny-llama-draft, tiny-qwen2-vl*) or a model directory "
            "(*tiny-nothing': no such directory)"
        ]
    )


def test_a_bad_ini_value_names_the_value_and_the_file(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nprefixcache_model = tiny-nothing\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*prefixcache_model in *tox.ini: 'tiny-nothing' is not a fixture model (*"]
    )


def test_the_cli_refuses_a_bad_value_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["verify", "--model", "tiny-nothing"])
    assert info.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "error: argument --model: 'tiny-nothing' is not a fixture model (" in err


def test_a_matrix_model_is_checked_and_resolved_against_the_file(tmp_path: Path) -> None:
    mine = _model_dir(tmp_path, "m/models/mine")
    path = tmp_path / "m" / "m.toml"
    path.write_text(
        '[defaults]\nmodel = "tiny-llama"\n'
        '[[config]]\nname = "a"\nengine = "x:y"\n'
        '[[config]]\nname = "b"\nengine = "x:y"\nmodel = "models/mine"\n'
    )
    a, b = read_matrix(path)
    assert (a.overrides["model"], b.overrides["model"]) == (LLAMA, str(mine))
    assert b.environment() == {MODEL_ENV: str(mine)}
    path.write_text('[[config]]\nname = "a"\nengine = "x:y"\nmodel = "tiny-nothing"\n')
    with pytest.raises(MatrixError, match=r"config 'a': key 'model': 'tiny-nothing' is not a fix"):
        read_matrix(path)


# -- end to end: the header, the reports, the replay and the engine factory ------------------


def test_the_model_reaches_the_factory_the_header_and_the_json_report(
    pytester: pytest.Pytester,
) -> None:
    _recorded(pytester)
    result = _run(
        pytester, "recorded:build",
        args=("--prefixcache-report=r.json", "--prefixcache-model=tiny-llama"), examples=2,
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            f"prefixcache: engine recorded:build (option), model {LLAMA} (option), 2 examples "
            "per property, tolerance exact or the engine's own rule, timeout 60 s",
            f"engine: recorded:build; model: {LLAMA}; tolerance: exact",
        ]
    )
    assert _built(pytester) == {LLAMA}
    report = json.loads((pytester.path / "r.json").read_text())
    assert (report["engine"], report["model"]) == ("recorded:build", LLAMA)
    assert MODEL_ENV not in os.environ  # restored when the in-process session ended


def test_without_the_option_the_factory_sees_no_model(pytester: pytest.Pytester) -> None:
    """Negative control: the header names no model, the factory gets no variable, the
    reference engine's resolution is the tiny Qwen2-VL."""
    pytest.importorskip("mlx.core")
    _recorded(pytester)
    result = _run(
        pytester, "a=recorded:build", "b=recorded:reference", args=("--prefixcache-report=r.json",)
    )
    result.assert_outcomes(passed=2)
    assert _built(pytester) == {"<unset>", QWEN2_VL}
    out = result.stdout.str()
    assert "; model " not in out and "; model: " not in out  # header rows, summary
    assert json.loads((pytester.path / "r.json").read_text())["model"] is None


def test_the_model_reaches_a_factory_as_its_model_dir_argument(pytester: pytest.Pytester) -> None:
    """A factory with a ``model_dir`` parameter is given the model (no environment needed);
    negative control: without the option it keeps its default (None)."""
    _recorded(pytester)
    _run(pytester, "recorded:build_with", args=("--prefixcache-model=tiny-llama",)).assert_outcomes(
        passed=1
    )
    assert _built(pytester) == {f"arg {LLAMA}"}
    (pytester.path / "built.txt").unlink()
    _run(pytester, "recorded:build_with").assert_outcomes(passed=1)
    assert _built(pytester) == {"arg None"}


def test_with_model_passes_the_model_only_where_it_is_declared() -> None:
    """``with_model``: a factory declaring ``model_dir`` gets it; one without it (the variable
    still reaches it), a configuration's own ``model_dir``, an engine instance and no model
    are left as they are."""
    from pytest_prefixcache.session.fixtures import with_model

    def declares(model_dir: str | None = None) -> None: ...

    def reads_the_variable() -> None: ...

    class Instance:
        def run(self) -> None: ...

        def reset(self) -> None: ...

    assert with_model(declares, {"flags": []}, "/m") == {"flags": [], "model_dir": "/m"}
    assert with_model(reads_the_variable, {}, "/m") == {}
    assert with_model(declares, {"model_dir": "/own"}, "/m") == {"model_dir": "/own"}
    assert with_model(Instance(), {}, "/m") == {}
    assert with_model(declares, {}, None) == {}


def test_the_reference_engine_loads_the_model_the_option_names(pytester: pytest.Pytester) -> None:
    pytest.importorskip("mlx.core")
    _recorded(pytester)
    mine = _model_dir(pytester.path)
    result = _run(pytester, "recorded:reference", args=("--prefixcache-model=models/mine",))
    result.assert_outcomes(passed=1)
    assert _built(pytester) == {str(mine)}


def test_every_replay_command_names_the_model(pytester: pytest.Pytester) -> None:
    _recorded(pytester)
    mine = _model_dir(pytester.path)
    result = _run(
        pytester, "fakeengines:lie",
        args=("--prefixcache-report=r.json", "--prefixcache-model=models/mine"), examples=5,
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    report = json.loads((pytester.path / "r.json").read_text())
    [failure] = report["failures"]
    assert failure["replay"] in result.stdout.str()
    assert report["run"]["flags"] == [
        "--prefixcache-verify", "--prefixcache-engine=fakeengines:lie",
        f"--prefixcache-model={mine}",
    ]  # fmt: skip
    assert report["run"]["model"] == str(mine)
    assert run_file(pytester.path) == report["run"]
    shutil.rmtree(pytester.path / ".prefixcache" / "failures")
    fixture = _run(
        pytester, "fakeengines:lie", args=("--prefixcache-model=tiny-llama",), examples=5
    )
    fixture.stdout.fnmatch_lines([f"*replay: {REPLAY_LINE}"])
    assert run_file(pytester.path)["flags"][-1] == "--prefixcache-model=tiny-llama"


def test_a_matrix_config_loads_its_own_model(pytester: pytest.Pytester) -> None:
    _recorded(pytester)
    mine = _model_dir(pytester.path)
    pytester.path.joinpath("m.toml").write_text(
        '[[config]]\nname = "own"\nengine = "recorded:build"\nmodel = "models/mine"\n'
        '[[config]]\nname = "session"\nengine = "recorded:build"\n'
    )
    result = _run(
        pytester,
        args=("--prefixcache-matrix=m.toml", "--prefixcache-model=tiny-llama",
              "--prefixcache-report=r.json"),
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            f"prefixcache: configuration own: recorded:build; model {mine} (matrix); *",
            f"prefixcache: configuration session: recorded:build; model {LLAMA} (option); *",
        ]
    )
    assert _built(pytester) == {str(mine), LLAMA}
    rows = json.loads((pytester.path / "r.json").read_text())["configs"]
    assert [r["model"] for r in rows] == [str(mine), LLAMA]


@pytest.mark.slow
def test_xdist_workers_export_the_model(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    _recorded(pytester)
    result = _run(
        pytester, "recorded:build", args=("--prefixcache-model=tiny-llama", "-n", "2"),
        k="request_streams or corpus", examples=2, subprocess=True,
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    assert _built(pytester) == {LLAMA}


@pytest.mark.slow
def test_the_cli_passes_a_relative_directory_as_an_absolute_one(tmp_path: Path) -> None:
    (tmp_path / "fakeengines.py").write_text(ENGINES_SOURCE, encoding="utf-8")
    (tmp_path / "recorded.py").write_text(RECORDED, encoding="utf-8")
    mine = _model_dir(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "pytest_prefixcache.cli", "verify", "--engine", "recorded:build",
         "--model", "models/mine", "--examples", "1", "--seed", "1", "--database", "none",
         "--", "-k", "request_streams"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == cli.EXIT_OK, res.stdout + res.stderr
    report = json.loads((tmp_path / "prefixcache-report" / "report.json").read_text())
    assert report["model"] == str(mine)
    assert set((tmp_path / "built.txt").read_text().splitlines()) == {str(mine)}


# -- the engines: the variable, else their fixture; the wrong kind refused -------------------


def test_default_engine_reads_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("mlx.core")
    import reference_engine

    vlm = _vlm_dir(tmp_path)
    loaded: list[Path] = []
    monkeypatch.setattr(reference_engine, "shared_model", loaded.append)  # the load it shares
    monkeypatch.setattr(reference_engine, "Engine", lambda model, **kw: model)
    reference_engine.default_engine()  # negative control: unset, the tiny Qwen2-VL
    monkeypatch.setenv(MODEL_ENV, str(vlm))
    reference_engine.default_engine()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(MODEL_ENV, "models/vlm")  # relative: against the working directory
    reference_engine.default_engine()
    monkeypatch.setenv(MODEL_ENV, "tiny-qwen2-vl")  # a fixture name in the variable
    reference_engine.default_engine()
    assert loaded == [Path(QWEN2_VL), vlm, vlm, Path(QWEN2_VL)]
    monkeypatch.setenv(MODEL_ENV, "tiny-nothing")
    with pytest.raises(EngineError, match=r"PREFIXCACHE_MODEL=tiny-nothing: 'tiny-nothing' is"):
        reference_engine.default_engine()
    monkeypatch.setenv(MODEL_ENV, "tiny-llama")
    with pytest.raises(EngineError, match=rf"the reference engine needs a vision-language model: "
                       rf"'{LLAMA}' has no vision_config"):  # fmt: skip
        reference_engine.default_engine()


def test_a_text_only_adapter_refuses_a_vision_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_prefixcache.adapters import mlx_lm, presets, seed

    monkeypatch.setenv(MODEL_ENV, "tiny-qwen2-vl")
    says = rf"needs a text-only model: '{QWEN2_VL}' has a vision_config in its config.json"
    with pytest.raises(EngineError, match=r"the mlx-lm adapter " + says):
        mlx_lm.tiny_llama()
    with pytest.raises(EngineError, match=r"mlx_lm.server " + says):
        presets.mlx_lm_server()
    with pytest.raises(EngineError, match=r"the seed engines without --mllm \(text only\) "):
        seed.model_dir(["--continuous-batching"])
    assert seed.model_dir(["--mllm"]) == Path(QWEN2_VL)


def test_a_vision_adapter_refuses_a_text_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_prefixcache.adapters import mlx_vlm_apc, presets

    says = rf"needs a vision-language model: '{LLAMA}' has no vision_config in its config.json"
    with pytest.raises(EngineError, match=r"the reference server " + says):
        presets.reference_server("tiny-llama")
    with pytest.raises(EngineError, match=r"mlx_vlm.server " + says):
        presets.mlx_vlm_server(model_dir=LLAMA)
    monkeypatch.setenv(MODEL_ENV, "tiny-llama")
    with pytest.raises(EngineError, match=r"the mlx-vlm APC adapter " + says):
        mlx_vlm_apc.tiny_qwen2_vl()


def test_the_reference_server_preset_passes_the_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from pytest_prefixcache.adapters import presets

    for module in (presets.reference, presets.mlx_lm, presets.mlx_vlm, presets.server):
        monkeypatch.setattr(module, "OpenAIEngine", lambda cmd, **kw: str(cmd))
    assert f"-m reference_engine.server --model {QWEN2_VL} " in str(presets.reference_server())
    vlm = _vlm_dir(tmp_path, "my vlm")  # a space: the command quotes the path
    monkeypatch.setenv(MODEL_ENV, str(vlm))
    assert f"--model '{vlm}' " in str(presets.reference_server())
