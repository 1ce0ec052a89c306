"""The oMLX preset (adapters/omlx.py) in CI, without oMLX: its command lines, its cold server,
its block size per family, the launcher's settings, and end to end against tests/omlx_standin/
(an ``omlx`` package that answers like flyto-mlx 0.7.0: ``serve --model-dir``, the model's own
chat template, whole-block reuse, ``cached_tokens``, ``/api/status``, the debug hit line). The
positive control: the honest stand-in passes with every claim source agreeing with the tap; the
negative controls: a stand-in that over-claims in one source fails the claims check, naming it.
(The real engine runs under engines/omlx/verify.sh and engines/omlx/test_omlx_engine.py.)"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from adapter_support import SYSTEM, assistant, req, user

from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.omlx import (
    block_size,
    claim_specs,
    commands,
    model_dir,
    omlx_server,
    requested_block,
    slug,
)
from pytest_prefixcache.adapters.omlx_launch import split_settings
from pytest_prefixcache.errors import ClaimsFailure, EngineError
from pytest_prefixcache.verify import Verifier

STANDIN = Path(__file__).parent / "omlx_standin"
LONG = user("Tell me a long story about a cat and a dog who crossed the mountains together.")
STREAM = [
    req(SYSTEM, LONG, max_new_tokens=2),
    req(SYSTEM, LONG, max_new_tokens=2),  # an identical repeat: whole blocks reused
    req(SYSTEM, LONG, assistant("Once upon a time."), user("And then?"), max_new_tokens=1),
]


def test_the_cold_server_drops_the_cache_flags_and_turns_the_cache_off() -> None:
    model = model_dir("tiny-llama")
    flags = ["--hot-cache-max-size 256MB", "--setting cache.hot_cache_only=true",
             "--setting scheduler.chunked_prefill=true", "--block-size 32"]  # fmt: skip
    cached, cold = commands(flags, "/venv/python", model)
    assert cached[:5] == ["/venv/python", "-m", "pytest_prefixcache.tap",
                          "pytest_prefixcache.adapters.omlx_launch:main", "serve"]  # fmt: skip
    # oMLX serves the model folders of --model-dir by name: the fixture's parent directory
    assert cached[5:7] == ["--model-dir", str(model.parent)]
    assert cached[-8:] == ["--hot-cache-max-size", "256MB", "--setting",
                           "cache.hot_cache_only=true", "--setting",
                           "scheduler.chunked_prefill=true", "--block-size", "32"]  # fmt: skip
    assert cold[-3:] == ["--setting", "scheduler.chunked_prefill=true", "--no-cache"]
    assert "256MB" not in cold and "cache.hot_cache_only=true" not in cold and "32" not in cold
    with pytest.raises(EngineError, match="--no-cache is the cold server's flag"):
        commands(["--no-cache"], "p", model)


def test_the_block_size_is_the_schedulers_for_each_family() -> None:
    assert block_size(model_dir("tiny-llama")) == 256
    assert block_size(model_dir("tiny-qwen2-vl")) == 256
    assert block_size(model_dir("tiny-llama"), 32) == 32  # the launcher's --block-size
    # a sliding window of 32: the smallest multiple in 512-1024, whatever was asked for
    assert block_size(model_dir("tiny-gemma3-text"), 32) == 512
    assert block_size(model_dir("tiny-gemma3")) == 512
    # recurrent hybrids: at least 2048
    assert block_size(model_dir("tiny-qwen3.5"), 32) == 2048
    assert block_size(model_dir("tiny-qwen3.5-vl")) == 2048
    assert requested_block(["--hot-cache-max-size 1GB", "--block-size 16"]) == 16
    assert requested_block([]) is None
    with pytest.raises(EngineError, match="--block-size 'x' is not a positive int"):
        requested_block(["--block-size x"])


def test_claim_sources_and_file_names() -> None:
    specs = claim_specs()
    assert specs[0] == {"api": "usage.prompt_tokens_details.cached_tokens"}
    assert {"stats": "/api/status", "field": "total_cached_tokens", "unit": "tokens"} in specs
    assert any("log" in s and "paged" in str(s["log"]) for s in specs)
    name = slug(["--hot-cache-max-size 256MB", "--block-size 32"], model_dir("tiny-llama"))
    assert name == "omlx-tiny-llama--hot-cache-max-size--256MB--block-size--32"


def test_the_launcher_splits_its_settings_from_omlxs_arguments() -> None:
    argv = ["serve", "--setting", "cache.hot_cache_only=true", "--port", "1",
            "--setting=scheduler.max_concurrent_requests=1",
            "--setting", "server.x=abc"]  # fmt: skip
    rest, settings = split_settings(argv)
    assert rest == ["serve", "--port", "1"]
    assert settings == {
        "cache": {"hot_cache_only": True},
        "scheduler": {"max_concurrent_requests": 1},
        "server": {"x": "abc"},
    }
    with pytest.raises(SystemExit, match=r"'nodot=1' is not SECTION\.FIELD=VALUE"):
        split_settings(["--setting", "nodot=1"])


def test_a_missing_engine_environment_is_named() -> None:
    with pytest.raises(EngineError, match=r"no oMLX environment at /nowhere/python: run "):
        omlx_server("tiny-llama", python="/nowhere/python")


# -- end to end against the stand-in ---------------------------------------------------------


@contextmanager
def standin(
    flags: tuple[str, ...] = ("--block-size 16",), fault: str = ""
) -> Iterator[OpenAIEngine]:
    env = {"PYTHONPATH": str(STANDIN), "PREFIXCACHE_TAP_TARGETS": "omlx.cli:Model"}
    if fault:
        env["OMLX_STANDIN_FAULT"] = fault
    engine = omlx_server(
        "tiny-llama", flags, python=sys.executable, env=env, audit=False, start_timeout=60
    )
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(autouse=True)
def _failures_in_tmp(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The verifier saves a failing stream under .prefixcache/ in the working directory."""
    request.getfixturevalue("monkeypatch").chdir(tmp_path)


@pytest.mark.slow  # two server starts: 17 s on the shared 2-core machine
def test_the_honest_standin_passes_with_every_claim_source() -> None:
    with standin() as engine:
        assert (engine.reuse_reference, engine.block_size) == ("block", 16)
        verifier = Verifier(engine)
        steps = verifier.run(STREAM)
    repeat = steps[1].cached
    assert repeat.claims is not None
    assert repeat.cached_tokens is not None and repeat.cached_tokens > 0
    assert repeat.cached_tokens % 16 == 0  # whole blocks only
    assert [c.value for c in repeat.claims.reuse] == [repeat.cached_tokens] * 3
    assert steps[2].cached.cached_tokens == repeat.cached_tokens  # the history's whole blocks
    report = verifier.report
    assert report.failures_by_check == {}
    assert report.claims_checked == 3 * 2 * len(STREAM)
    assert report.block_size == 16 and report.reference == "block"


@pytest.mark.slow  # two server starts each: 8-13 s
@pytest.mark.parametrize(
    ("fault", "source"),
    [
        ("api-overclaim", "API usage.prompt_tokens_details.cached_tokens"),
        ("stats-overclaim", "stats GET /api/status total_cached_tokens (delta)"),
        ("log-false-hit", "log /(?:paged|partial) cache hit, (\\d+) tokens/"),
    ],
)
def test_a_standin_that_over_claims_fails_the_claims_check(fault: str, source: str) -> None:
    with standin(fault=fault) as engine, pytest.raises(ClaimsFailure) as info:
        Verifier(engine).run(STREAM)
    first = str(info.value).splitlines()[0]
    assert first.startswith(f"claims: cached run: {source} claims ")
    assert "(reused " in first and "the logit tap)" in first


def test_a_model_setting_goes_to_model_settings_json_for_each_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--setting model.FIELD=VALUE`` (TurboQuant has no flag, only a per-model setting) lands
    in the base path's model_settings.json under every model directory, not in settings.json;
    omlx gets the other arguments."""
    import types

    from pytest_prefixcache.adapters import omlx_launch

    models = tmp_path / "models"
    (models / "tiny-llama").mkdir(parents=True)
    (models / "tiny-gemma3").mkdir()
    seen: list[list[str]] = []
    cli = types.ModuleType("omlx.cli")
    cli.main = lambda: seen.append(list(sys.argv))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "omlx", types.ModuleType("omlx"))
    monkeypatch.setitem(sys.modules, "omlx.cli", cli)
    monkeypatch.setenv("FMLX_BASE_PATH", str(tmp_path / "base"))
    argv = ["x", "serve", "--model-dir", str(models), "--setting", "cache.hot_cache_only=true",
            "--setting", "model.turboquant_kv_enabled=true",
            "--setting", "model.turboquant_kv_bits=4"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    assert omlx_launch.main() == 0
    assert seen == [["omlx", "serve", "--model-dir", str(models)]]
    written = json.loads((tmp_path / "base" / "model_settings.json").read_text())
    wanted = {"turboquant_kv_enabled": True, "turboquant_kv_bits": 4}
    assert written == {"version": 1, "models": {"tiny-gemma3": wanted, "tiny-llama": wanted}}
    settings = json.loads((tmp_path / "base" / "settings.json").read_text())
    assert settings == {"cache": {"hot_cache_only": True}}  # no "model" section there
    monkeypatch.setattr(sys, "argv", ["x", "serve", "--setting", "model.turboquant_kv_bits=4"])
    with pytest.raises(SystemExit, match="needs --model-dir"):
        omlx_launch.main()
