"""The public record's runner for the seed engines (engines/history/history_seed.py): the
one-combination matrix that starts an old vllm-mlx or rapid-mlx in its layered environment,
the verifier's own interpreter, and the catalogue's bounds; with stubs."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import history_seed  # noqa: E402
from history_catalogue import CatalogueError, loads  # noqa: E402
from history_runner import command, companions, mlx_for, uses_matrix  # noqa: E402
from test_history import CHECKS, GOOD, stub_bug  # noqa: E402

from pytest_prefixcache.session.matrix_file import read_matrix  # noqa: E402

PYTHON = Path("/h/rapid-mlx-0.12.7/bin/python")


def rapid(**changes: object) -> object:
    base = stub_bug(engine="rapid-mlx", runner="rapid-mlx", buggy="0.12.7", fixed="0.12.8")
    return replace(base, **changes)  # type: ignore[arg-type]


def test_a_rapid_mlx_0_12_entry_runs_its_vllm_mlx_cli_and_restarts(tmp_path: Path) -> None:
    bug = rapid(concurrency=1, flags="--max-num-seqs 2")
    (tmp_path / "matrix.toml").write_text(history_seed.matrix_text(bug, "0.12.7", PYTHON))
    (target,) = read_matrix(tmp_path / "matrix.toml")  # the plugin's own parser
    assert target.engine == "pytest_prefixcache.adapters.seed:seed_server"
    assert target.args == {
        "engine": "rapid-mlx",
        "python": str(PYTHON),
        "audit": False,
        "claims": False,
        "cli": "vllm_mlx.cli:main",
        "resets": "restart",
    }
    assert target.flags == ("--max-num-seqs", "2")


def test_a_vllm_mlx_entry_keeps_the_adapters_cli_and_resets(tmp_path: Path) -> None:
    bug = stub_bug(engine="vllm-mlx", runner="vllm-mlx", buggy="0.4.1", fixed="0.5.0")
    (tmp_path / "matrix.toml").write_text(history_seed.matrix_text(bug, "0.4.1", PYTHON))
    (target,) = read_matrix(tmp_path / "matrix.toml")
    assert target.args == {
        "engine": "vllm-mlx",
        "python": str(PYTHON),
        "audit": False,
        "claims": False,
        "concurrency": 8,  # the stub's waves
    }
    assert not target.flags
    assert history_seed.cli_of(rapid(), "0.16.10") == ""  # a later series: the default


@pytest.mark.parametrize("version", ["0.6.64", "0.9.10", "0.10.15", "0.12.16"])
def test_every_rapid_mlx_series_before_its_own_package_runs_vllm_mlx_and_restarts(
    version: str,
) -> None:
    assert history_seed.cli_of(rapid(), version) == "vllm_mlx.cli:main"
    text = history_seed.matrix_text(rapid(), version, PYTHON)
    assert 'resets = "restart"' in text and 'cli = "vllm_mlx.cli:main"' in text
    assert "resets" not in history_seed.matrix_text(rapid(), "0.16.10", PYTHON)


def test_the_verifier_runs_in_this_interpreter_and_the_server_in_the_venv(tmp_path: Path) -> None:
    bug = rapid()
    run = command(bug, "buggy", PYTHON, tmp_path)
    assert run.argv[0] == sys.executable and str(PYTHON) not in run.argv
    assert f"--prefixcache-matrix={tmp_path / 'matrix.toml'}" in run.argv
    assert "--prefixcache-allow-partial" in run.argv  # audit off, as engines/seed runs it
    assert uses_matrix(bug) and companions(bug, "buggy") == {}
    assert mlx_for(bug, "fixed") == "the seed environment's"
    plain = command(stub_bug(), "buggy", PYTHON, tmp_path)  # an mlx-lm row: its own venv
    assert plain.argv[0] == str(PYTHON) and "--prefixcache-allow-partial" not in plain.argv


def test_a_missing_seed_environment_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEED_DIR", str(tmp_path / "seed"))
    with pytest.raises(RuntimeError, match=r"no seed environment at .*seed/rapid-mlx"):
        history_seed.install(rapid(), "0.12.7", tmp_path / "rapid-mlx-0.12.7")
    assert not (tmp_path / "rapid-mlx-0.12.7").exists()  # nothing made before the check


def test_the_catalogue_bounds_the_seed_runners() -> None:
    seed = GOOD.replace('engine = "mlx-lm"', 'engine = "vllm-mlx"')
    seed = seed.replace('runner = "mlx-lm"', 'runner = "vllm-mlx"')
    assert loads(CHECKS, seed.replace('"0.31.0"', '"0.4.1"').replace('"0.31.1"', '"0.5.0"'))
    assert loads(CHECKS, seed.replace('"0.31.0"', '"0.2.8"').replace('"0.31.1"', '"0.2.9"'))
    with pytest.raises(CatalogueError, match=r"vllm-mlx runs versions from 0\.2\.8"):
        loads(CHECKS, seed.replace('"0.31.0"', '"0.2.7"').replace('"0.31.1"', '"0.2.8"'))
    fork = GOOD.replace('runner = "mlx-lm"', 'runner = "rapid-mlx"')
    assert loads(CHECKS, fork.replace('"0.31.0"', '"0.6.64"').replace('"0.31.1"', '"0.6.65"'))
    with pytest.raises(CatalogueError, match=r"rapid-mlx runs versions from 0\.6\.0"):
        loads(CHECKS, fork.replace('"0.31.0"', '"0.5.10"').replace('"0.31.1"', '"0.6.0"'))


def test_an_entry_served_under_a_hub_name_passes_it_to_the_seed_server(tmp_path: Path) -> None:
    bug = rapid(served_as="mlx-community/Tmax-9B-MLX-4bit")
    (tmp_path / "matrix.toml").write_text(history_seed.matrix_text(bug, "0.10.15", PYTHON))
    (target,) = read_matrix(tmp_path / "matrix.toml")
    assert target.args["served_as"] == "mlx-community/Tmax-9B-MLX-4bit"
    plain = history_seed.matrix_text(rapid(), "0.10.15", PYTHON)
    assert "served_as" not in plain
    entry = GOOD.replace('runner = "mlx-lm"', 'runner = "rapid-mlx"')
    entry = entry.replace('"0.31.0"', '"0.10.15"').replace('"0.31.1"', '"0.10.16"')
    named = entry.replace('runner = "rapid-mlx"', 'runner = "rapid-mlx"\nserved_as = "o/n"')
    (bug,) = loads(CHECKS, named)
    assert bug.served_as == "o/n"
    with pytest.raises(CatalogueError, match="served_as: only the seed engines"):
        loads(CHECKS, GOOD.replace('runner = "mlx-lm"', 'runner = "mlx-lm"\nserved_as = "o/n"'))


def test_rapid_mlx_0_6_is_asked_for_no_top_logprobs(tmp_path: Path) -> None:
    # 0.6.64 and 0.6.65 answer 500 to any request asking for top_logprobs (the #435 run)
    (tmp_path / "matrix.toml").write_text(history_seed.matrix_text(rapid(), "0.6.64", PYTHON))
    (target,) = read_matrix(tmp_path / "matrix.toml")
    assert target.args["top_logprobs"] == 0
    for version in ("0.9.10", "0.12.8", "0.16.10"):  # their logprobs are served
        assert "top_logprobs" not in history_seed.matrix_text(rapid(), version, PYTHON)


def test_an_efficiency_floor_reaches_the_run_and_is_a_fraction(tmp_path: Path) -> None:
    bug = rapid(min_efficiency=0.5, select="test_corpus")
    run = command(bug, "buggy", PYTHON, tmp_path)
    assert "--prefixcache-min-efficiency=0.5" in run.argv
    plain = command(rapid(), "buggy", PYTHON, tmp_path)  # the control: no floor unless asked
    assert not any(w.startswith("--prefixcache-min-efficiency") for w in plain.argv)
    entry = GOOD.replace('runner = "mlx-lm"', 'runner = "mlx-lm"\nmin_efficiency = 0.5')
    assert loads(CHECKS, entry)[0].min_efficiency == 0.5
    with pytest.raises(CatalogueError, match=r"min_efficiency: 1\.5 is not a fraction in \(0, 1\]"):
        loads(CHECKS, entry.replace("0.5", "1.5"))
