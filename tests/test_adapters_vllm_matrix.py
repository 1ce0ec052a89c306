"""adapters.vllm without vLLM: the command line a flag combination gives (base arguments it
names are replaced), the block reference in force, the claim sources against the vLLM stub's
counters (tests/stub_openai.py) with an over-claiming negative control, the waves refusal with
claims, and engines/vllm/matrix.toml through ``--prefixcache-matrix`` against the stub (each
combination started with its flags; the over-claiming stub fails the claims check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from adapter_support import SYSTEM, req, user
from stub_openai import PAD

from pytest_prefixcache import EngineError
from pytest_prefixcache.adapters.flags import flag_value, split_flags
from pytest_prefixcache.adapters.presets import vllm_matrix_engine as reexported
from pytest_prefixcache.adapters.vllm import (
    claim_specs,
    command,
    model_path,
    vllm_matrix_engine,
    vllm_server,
)
from pytest_prefixcache.checks.claims import claim_problems
from pytest_prefixcache.session.matrix_file import read_matrix

ROOT = Path(__file__).resolve().parent.parent
STUB = Path(__file__).resolve().parent / "stub_openai.py"
MATRIX = ROOT / "engines" / "vllm" / "matrix.toml"
LONG = "Hello there, how are you today? Tell me a long story about cats and their habits. " * 2
TEXT = req(SYSTEM, user(LONG))


def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 264, "image_token_id": PAD}))
    return tmp_path


def test_a_flag_that_names_a_base_argument_replaces_it() -> None:
    base = command("/m", [], "nice -n 5 /venv/python", block_size=32, max_logprobs=264)
    assert base[:5] == ["nice", "-n", "5", "/venv/python", "-m"]
    assert base[base.index("--block-size") + 1] == "32" and "--enable-prefix-caching" in base
    assert base[base.index("--max-num-seqs") + 1] == "4"
    flags = ["--block-size 128", "--max-num-seqs=2", "--no-enable-prefix-caching"]
    cmd = command("/m", flags, "py", block_size=128, max_logprobs=264)
    assert cmd.count("--block-size") == 1
    assert "--enable-prefix-caching" not in cmd and "--max-num-seqs" not in cmd
    assert cmd[-4:] == ["--block-size", "128", "--max-num-seqs=2", "--no-enable-prefix-caching"]
    assert cmd[cmd.index("--max-logprobs") + 1] == "264" and "--dtype" in cmd
    assert flag_value(split_flags(["--block-size 64"]), "--block-size") == "64"
    assert flag_value(["--block-size=96", "--x"], "--block-size") == "96"
    assert flag_value(["-np", "2", "--parallel=4"], ("-np", "--parallel")) == "4"  # the last wins
    assert flag_value(["--x", "--block-size"], "--block-size") == ""  # given with no value
    assert flag_value([], "--block-size") is None


PYTHON = f"{sys.executable} {STUB} --flavour vllm"  # the engine starts its server when built


def test_reuse_is_judged_against_the_block_size_in_force(tmp_path: Path) -> None:
    with vllm_server(model_dir(tmp_path), python=PYTHON, flags=["--block-size 128"]) as engine:
        assert (engine.reuse_reference, engine.block_size) == ("block", 128)
    with vllm_server(model_dir(tmp_path), python=PYTHON) as plain:
        assert (plain.reuse_reference, plain.block_size, plain.readout.claims) == (
            "block",
            32,
            None,
        )
        assert plain.caches_output  # type: ignore[attr-defined]


def test_claims_and_waves_are_declared_apart(tmp_path: Path) -> None:
    with vllm_server(model_dir(tmp_path), python=PYTHON, concurrency=4) as engine:
        assert engine.max_concurrency == 4 and engine.readout.claims is None
    with vllm_server(model_dir(tmp_path), python=PYTHON, concurrency=4, claims=True) as both:
        assert both.max_concurrency == 4 and both.readout.claims is not None
    specs = claim_specs()
    assert specs[0] == {"api": "usage.prompt_tokens_details.cached_tokens"}
    assert {s.get("metric") for s in specs[1:]} == {
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_cached_total",
        "vllm:prompt_tokens_by_source_total",
    }
    assert all(s.get("unit", "tokens") == "tokens" for s in specs)


def test_the_matrix_factory_names_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert reexported is vllm_matrix_engine
    monkeypatch.setenv("VLLM_MODELS", str(tmp_path / "models"))
    assert model_path("vl") == tmp_path / "models" / "tiny-qwen2-vl-hf"
    assert model_path(str(tmp_path)) == tmp_path
    with pytest.raises(EngineError, match="no vLLM environment at /nowhere/bin/python"):
        vllm_matrix_engine("text", python="nice -n 5 /nowhere/bin/python")
    with pytest.raises(EngineError, match=r"run 'engines/vllm/run\.sh models'"):
        vllm_matrix_engine("text", python=sys.executable)
    monkeypatch.setenv("VLLM_AUDIT", "1")
    with vllm_matrix_engine(str(model_dir(tmp_path)), python=PYTHON) as audited:
        assert audited.supports_fresh_instances and audited.readout.claims is not None


def stub_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str = "") -> object:
    monkeypatch.setenv("STUB_FAULT", fault)
    return vllm_matrix_engine(str(model_dir(tmp_path)), ["--block-size 32"], python=PYTHON)


@pytest.mark.parametrize("fault", ["", "metric_overclaim"], ids=["honest", "overclaim"])
def test_the_counters_are_read_around_every_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """An honest stub's three counters agree with ``cached_tokens``; one whose counters add a
    block on every hit is named (the negative control)."""
    engine = stub_engine(tmp_path, monkeypatch, fault)
    with engine:  # type: ignore[attr-defined]
        engine.run(TEXT, use_cache=True)  # type: ignore[attr-defined]
        hit = engine.run(TEXT, use_cache=True)  # type: ignore[attr-defined]
    assert hit.claims is not None and (hit.cached_tokens or 0) > 0
    figures = {c.source: c.value for c in hit.claims.reuse}
    assert len(figures) == 4 and hit.claims.reused is None  # no tap: compared with each other
    problems = claim_problems(hit)
    if not fault:
        assert set(figures.values()) == {hit.cached_tokens} and problems == []
    else:
        assert len(problems) == 3, problems
        over = f"claims {(hit.cached_tokens or 0) + 32} prompt token(s) reused, but API usage."
        assert all(over in p.headline for p in problems), problems


def _matrix_file(tmp_path: Path, name: str) -> Path:
    """engines/vllm/matrix.toml's configuration ``name`` on the stub and a fake model."""
    (tmp_path / "model").mkdir()
    model = model_dir(tmp_path / "model")
    text = MATRIX.read_text().replace('model = "text"', f'model = "{model}", python = "{PYTHON}"')
    text = text.replace('model = "vl"', f'model = "{model}", python = "{PYTHON}"')
    path = tmp_path / "m.toml"
    path.write_text(text.replace("timeout = 600", "timeout = 120\nexamples = 2"))
    assert any(t.base == name for t in read_matrix(path))
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFIXCACHE_", "STUB_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["", "metric_overclaim"], ids=["honest", "overclaim"])
def test_the_matrix_starts_each_combination_with_its_flags(tmp_path: Path, fault: str) -> None:
    """Two combinations of engines/vllm/matrix.toml's text configuration through
    ``prefixcache verify --matrix``: each server starts with the preset's arguments less those
    its flags replace; the honest stub passes (partial: not audited), the over-claiming one
    fails the claims check in both."""
    path = _matrix_file(tmp_path, "vllm-text")
    log = tmp_path / "argv.jsonl"
    env = {**_env(), "STUB_ARGV_LOG": str(log), "STUB_FAULT": fault}
    names = ["vllm-text[b32,chunked,sha256,auto,all]", "vllm-text[b128,chunked,sha256,auto,all]"]
    res = subprocess.run(
        [sys.executable, "-m", "pytest_prefixcache.cli", "verify", "--matrix", str(path),
         *(f"--config={n}" for n in names), "--allow-partial", "--seed", "1",
         "--database", "none", "--out", "out", "--", "-k", "request_streams",
         "-p", "no:randomly"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    started = [json.loads(line) for line in log.read_text().splitlines()]
    blocks = sorted(a[a.index("--block-size") + 1] for a in started)
    assert blocks == ["128", "32"] and all(a.count("--block-size") == 1 for a in started)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    verdicts = {c["name"]: c["verdict"] for c in report["configs"]}
    if not fault:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        assert verdicts == dict.fromkeys(names, "partial")
        assert all(c["failures_by_check"] == {} for c in report["configs"])
    else:
        assert res.returncode == 1, res.stdout[-3000:]
        assert verdicts == dict.fromkeys(names, "fail")
        assert all("claims" in c["failures_by_check"] for c in report["configs"])


@pytest.mark.parametrize("fault", ["", "corrupt"], ids=["honest", "corrupt"])
def test_a_waves_combination_sends_its_waves_through_the_preset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """``concurrency=4, claims=False`` (the matrix's waves configurations): the stub's waves
    pass when it is honest and fail when its hits move a step's logprobs (negative control)."""
    from test_adapters_waves import WAVES

    from pytest_prefixcache import EquivalenceFailure, Verifier
    from pytest_prefixcache.verify.concurrent import CONCURRENT, NO_ORDER

    monkeypatch.setenv("STUB_FAULT", fault)
    model = str(model_dir(tmp_path))
    with vllm_matrix_engine(model, ["--max-num-seqs 2"], concurrency=4, claims=False,
                            python=PYTHON) as engine:  # fmt: skip
        assert engine.max_concurrency == 4 and engine.readout.claims is None
        verifier = Verifier(engine)
        if fault:
            with pytest.raises(EquivalenceFailure, match=r"wave \d, cache: .*: logits differ"):
                verifier.run_waves(WAVES)
        else:
            verifier.run_waves(WAVES)
            assert verifier.report.coverage[CONCURRENT] == {NO_ORDER: 6}
            assert verifier.report.cache_hits >= 1
