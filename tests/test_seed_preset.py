"""The seed-engine preset without the engines: the command lines, the cold baseline's flags,
the declared claim sources per engine path, and the reset that tolerates vllm-mlx's error.
(The engines themselves run only under engines/seed/run.sh.)"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from pytest_prefixcache.adapters.flags import split_flags
from pytest_prefixcache.adapters.http.resets import refusal
from pytest_prefixcache.adapters.seed import (
    MLX_VLM,
    claim_specs,
    commands,
    model_dir,
    seed_server,
    slug,
)
from pytest_prefixcache.errors import EngineError


def test_a_matrix_alternative_may_carry_a_value() -> None:
    flags = ["--continuous-batching", "--chunked-prefill-tokens 32", ""]
    assert split_flags(flags) == ["--continuous-batching", "--chunked-prefill-tokens", "32"]


def test_the_cold_server_keeps_the_engine_path_and_drops_the_cache_store() -> None:
    flags = ["--continuous-batching", "--use-paged-cache", "--paged-cache-block-size 16"]
    cached, cold = commands("vllm-mlx", [*flags, "--chunked-prefill-tokens 32"], "/venv/python")
    assert cached[:5] == ["/venv/python", "-m", "pytest_prefixcache.tap", "vllm_mlx.cli:main",
                          "serve"]  # fmt: skip
    assert cached[-5:] == ["--use-paged-cache", "--paged-cache-block-size", "16",
                           "--chunked-prefill-tokens", "32"]  # fmt: skip
    assert "--enable-metrics" in cached and "--enable-metrics" in cold
    assert cold[-4:] == ["--continuous-batching", "--chunked-prefill-tokens", "32",
                         "--disable-prefix-cache"]  # fmt: skip
    assert "16" not in cold  # the block size went with its flag
    rapid, rapid_cold = commands("rapid-mlx", ["--prefix-cache-index hash", "--mllm"], "p")
    assert rapid_cold[-2:] == ["--mllm", "--disable-prefix-cache"] and "hash" in rapid
    assert "--enable-metrics" not in rapid  # rapid-mlx serves /metrics unasked, refuses the flag


def test_each_combination_has_its_own_file_name() -> None:
    assert slug("vllm-mlx", ["--continuous-batching", "--chunked-prefill-tokens 32"]) == (
        "vllm-mlx--continuous-batching--chunked-prefill-tokens--32"
    )
    assert slug("rapid-mlx", []) == "rapid-mlx"


def test_mllm_serves_the_vision_model() -> None:
    assert model_dir(["--mllm"]).name == "tiny-qwen2-vl"
    assert model_dir(["--continuous-batching"]).name == "tiny-llama"


def stats_fields(specs: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [(s["field"], s["unit"]) for s in specs if "stats" in s]


def test_claim_sources_follow_the_engine_path() -> None:
    batched = claim_specs("vllm-mlx", ["--continuous-batching"])
    assert stats_fields(batched) == [("engine_cache.hits", "hits"),
        ("engine_cache.tokens_saved", "tokens"), ("engine_cache.misses", "misses")]  # fmt: skip
    assert all(s.get("optional") for s in batched if "stats" in s)
    assert any("log" in s for s in batched)
    # the simple engine's non-streaming path never looks its caches up: no misses counter,
    # no log line
    simple = claim_specs("vllm-mlx", [])
    assert stats_fields(simple) == [("engine_cache.system_kv_cache.counters.hits", "hits")]
    assert not any("log" in s for s in simple)
    mllm = claim_specs("vllm-mlx", ["--continuous-batching", "--mllm"])
    assert stats_fields(mllm)[0] == ("engine_cache.prefix_cache.hits", "hits")
    assert len(stats_fields(mllm)) == 2  # image requests skip the text prefix cache
    assert not any("log" in s for s in mllm)  # the MLLM scheduler logs no [schedule] line
    assert not any("log" in s for s in claim_specs("rapid-mlx", ["--mllm"]))
    rapid = claim_specs("rapid-mlx", [])
    assert rapid[0] == {"api": "usage.prompt_tokens_details.cached_tokens"}
    assert ("cache.misses", "misses") in stats_fields(rapid)


def test_a_missing_engine_environment_is_named() -> None:
    with pytest.raises(EngineError, match=r"no vllm-mlx environment at /nowhere/python"):
        seed_server("vllm-mlx", python="/nowhere/python")
    with pytest.raises(EngineError, match=r"seed engine 'sglang' is not one of"):
        commands("sglang", [], "p")


def test_a_tolerated_reset_error_is_a_reset_and_others_are_not() -> None:
    reply = {"status": "cleared", "engine_cache": {"memory_aware_cache": True}, "error": MLX_VLM}
    assert refusal(200, reply, (MLX_VLM,)) is None
    assert refusal(200, reply) == f"answered 200 with an error: {reply}"  # the default refuses
    assert refusal(200, {**reply, "error": "disk full"}, (MLX_VLM,)) is not None


def test_concurrent_noise_control_is_concurrent_only_where_the_cold_server_keeps_nothing() -> None:
    from pytest_prefixcache.adapters.seed import cold_baseline

    assert cold_baseline("rapid-mlx", [], 4) == "server"
    assert cold_baseline("vllm-mlx", ["--continuous-batching"], 4) == "server"
    assert cold_baseline("rapid-mlx", [], 1) == "reset"  # one at a time: reset as before
    # the simple engine ignores --disable-prefix-cache; the MLLM lanes keep other caches
    assert cold_baseline("vllm-mlx", [], 4) == "reset"
    assert cold_baseline("rapid-mlx", ["--mllm"], 4) == "reset"
    assert cold_baseline("vllm-mlx", ["--continuous-batching", "--mllm"], 4) == "reset"
    # a server only a restart empties (rapid-mlx 0.12): its cache-less twin is not reset
    assert cold_baseline("rapid-mlx", [], 1, restarts=True) == "server"
    assert cold_baseline("rapid-mlx", ["--mllm"], 1, restarts=True) == "reset"


def test_vllm_mlx_without_the_tap_is_refused(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("")  # exists: the check after it is the one under test
    with pytest.raises(EngineError, match="vllm-mlx returns no logprobs"):
        seed_server("vllm-mlx", python=str(python), tap=False)


def test_from_env_passes_concurrency_and_the_tap_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_prefixcache.adapters import seed

    seen: dict[str, object] = {}
    engine = types.SimpleNamespace()  # from_env sets the batch_invariant trait on it
    monkeypatch.setattr(seed, "seed_server", lambda *a, **k: seen.update(k) or engine)
    monkeypatch.setenv("SEED_ENGINE", "rapid-mlx")
    monkeypatch.setenv("PREFIXCACHE_CONCURRENCY", "4")
    monkeypatch.setenv("SEED_TAP", "0")
    assert seed.from_env() is engine and engine.batch_invariant is False
    assert seen["concurrency"] == 4 and seen["tap"] is False


def test_without_the_tap_the_cli_module_runs_itself() -> None:
    cached, cold = commands("rapid-mlx", ["--max-num-seqs 2"], "p", tap=False)
    assert cached[:4] == ["p", "-m", "rapid_mlx.cli", "serve"]
    assert "pytest_prefixcache.tap" not in cold and cold[-1] == "--disable-prefix-cache"


def test_another_cli_function_runs_in_place_of_the_engines() -> None:
    cached, cold = commands("rapid-mlx", [], "p", cli="vllm_mlx.cli:main")  # rapid-mlx 0.12
    assert cached[:5] == ["p", "-m", "pytest_prefixcache.tap", "vllm_mlx.cli:main", "serve"]
    assert cold[3] == "vllm_mlx.cli:main"
    assert commands("rapid-mlx", [], "p")[0][3] == "rapid_mlx.cli:main"  # the default stays
    untapped = commands("rapid-mlx", [], "p", tap=False, cli="vllm_mlx.cli:main")[0]
    assert untapped[2] == "vllm_mlx.cli"


def test_a_restart_stands_in_for_a_reset_that_leaves_the_cache() -> None:
    from pytest_prefixcache.adapters.http.resets import RESTART, endpoints, reset_caches

    (restart,) = endpoints(RESTART)
    # no request is sent: a dead URL would raise for a real endpoint (the negative control)
    assert reset_caches("http://127.0.0.1:9", [restart], 1.0, can_restart=True) is False
    with pytest.raises(EngineError, match="only a restart empties its cache"):
        reset_caches("http://127.0.0.1:9", [restart], 1.0, can_restart=False)
    with pytest.raises(EngineError, match="cannot reset"):
        reset_caches("http://127.0.0.1:9", endpoints("POST /v1/cache/clear"), 1.0,
                     can_restart=False)  # fmt: skip


def test_seed_server_passes_its_resets_and_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_prefixcache.adapters import seed

    seen: list[tuple[list[str], dict[str, object]]] = []

    def engine(cmd: list[str], **kw: object) -> object:
        seen.append((cmd, kw))
        raise RuntimeError("stop here")

    monkeypatch.setattr(seed, "OpenAIEngine", engine)
    python = tmp_path / "python"
    python.write_text("")
    for resets, cli in (("restart", "vllm_mlx.cli:main"), (None, None)):
        with pytest.raises(RuntimeError, match="stop here"):
            seed_server("rapid-mlx", python=str(python), resets=resets, cli=cli)
    (old_cmd, old), (new_cmd, new) = seen
    assert old["reset_paths"] == "restart" and old_cmd[3] == "vllm_mlx.cli:main"
    assert new["reset_paths"] == "POST /v1/cache/clear, DELETE /v1/cache"
    assert new_cmd[3] == "rapid_mlx.cli:main"
