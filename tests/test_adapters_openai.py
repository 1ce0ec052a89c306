"""The OpenAI-compatible HTTP adapter against the reference server, mlx_lm.server and
mlx_vlm.server on the tiny fixtures (127.0.0.1, ephemeral ports, servers stopped by PID)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mlx_lm")
pytest.importorskip("mlx_vlm")

from adapter_support import SYSTEM, assistant, img, req, resolve, top_diff, user, worst_diff

from pytest_prefixcache import EngineError
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.http.server import ServerProcess, http_json

HERE = Path(__file__).resolve().parent
NS = "x-prefixcache-namespace"
A, B = img(1), img(2)
IMAGE = req(SYSTEM, user(A, "What is in this image?"))
IMAGE_NEXT = req(*IMAGE.messages, assistant("a cat"), user("and the colour?"))
TEXT = req(SYSTEM, user("Hello there, how are you today? Tell me a long story about cats."))
TEXT_NEXT = req(*TEXT.messages, assistant("fine"), user("and now?"))


def engine_fixture(spec: str) -> Iterator[OpenAIEngine]:
    engine = resolve(spec)
    assert isinstance(engine, OpenAIEngine)
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="module")
def reference() -> Iterator[OpenAIEngine]:
    yield from engine_fixture("pytest_prefixcache.adapters.presets:reference_server")


@pytest.fixture(scope="module")
def lm() -> Iterator[OpenAIEngine]:
    yield from engine_fixture("pytest_prefixcache.adapters.presets:mlx_lm_server")


@pytest.fixture(scope="module")
def vlm() -> Iterator[OpenAIEngine]:
    yield from engine_fixture("pytest_prefixcache.adapters.presets:mlx_vlm_server")


def check(engine: OpenAIEngine, request: object, *, exact_logits: bool = False) -> int:
    cached = engine.run(request, use_cache=True)  # type: ignore[arg-type]
    cold = engine.run(request, use_cache=False)  # type: ignore[arg-type]
    assert cold.cached_tokens == 0
    assert cached.tokens == cold.tokens and len(cached.tokens) == 3
    assert top_diff(cached, cold) == 0.0
    if exact_logits:
        assert worst_diff(cached, cold) == 0.0
    return cached.cached_tokens or 0


def test_reference_server_stream(reference: OpenAIEngine) -> None:
    reference.reset()
    assert check(reference, IMAGE, exact_logits=True) == 0
    assert check(reference, IMAGE_NEXT, exact_logits=True) >= 64  # the image ends at token 63
    other = req(SYSTEM, user(B, "What is in this image?"))
    assert check(reference, other, exact_logits=True) == 47  # up to the image (tokens 47-62)
    out = reference.run(IMAGE, use_cache=True)
    assert out.top_logprobs is not None and len(out.top_logprobs) == 20
    assert out.prompt_tokens == 82 and out.cached_tokens == 81  # all but the last token
    # the reply extension: token ids, image spans and full logits, consistent with top_logprobs
    assert out.logits is not None and out.token_ids is not None and len(out.token_ids) == 82
    assert out.image_spans == ((47, 63, A.digest),)
    best = max(out.top_logprobs, key=out.top_logprobs.__getitem__)
    assert best == int(out.logits.argmax()) == out.tokens[0]


def test_reference_server_namespaces_and_reset(reference: OpenAIEngine) -> None:
    reference.reset()
    reference.run(TEXT, use_cache=True)
    assert reference.run(req(*TEXT.messages, namespace="b"), use_cache=True).cached_tokens == 0
    assert (reference.run(TEXT, use_cache=True).cached_tokens or 0) > 0
    reference.reset()
    assert reference.run(TEXT, use_cache=True).cached_tokens == 0


def test_salt_baseline_on_a_running_server(reference: OpenAIEngine) -> None:
    assert isinstance(reference.server, ServerProcess)
    salted = OpenAIEngine(url=reference.server.url, cold="salt", namespace_header=NS)
    salted.run(TEXT, use_cache=True)
    assert check(salted, TEXT) > 0


def test_restart_baseline() -> None:
    cmd = "{python} -m reference_engine.server --host 127.0.0.1 --port {port}"
    with OpenAIEngine(cmd, cold="restart") as engine:
        assert isinstance(engine.cold_server, ServerProcess)
        first = engine.cold_server.proc
        assert check(engine, TEXT) == 0  # a server just started is cold: no restart yet
        assert engine.cold_server.proc is first and first is not None
        assert check(engine, TEXT) > 0
        assert engine.cold_server.proc is not first
        assert first.poll() is not None  # the old baseline server is gone


@pytest.mark.slow
def test_a_corrupted_cached_result_is_caught() -> None:
    """Negative control: a server that corrupts one restored prefix, seen through the adapter."""
    bad = f"{{python}} {HERE / 'corrupt_reference_server.py'} --port {{port}}"
    good = "{python} -m reference_engine.server --host 127.0.0.1 --port {port}"
    with OpenAIEngine(bad, cold="reset", cold_cmd=good, top_logprobs=20) as engine:
        engine.run(TEXT, use_cache=True)
        cached = engine.run(TEXT_NEXT, use_cache=True)
        cold = engine.run(TEXT_NEXT, use_cache=False)
        assert (cached.cached_tokens or 0) > 0
        assert top_diff(cached, cold) > 1e-4
        # the blocks stored after the corrupted prefill carry the error into later hits
        assert top_diff(engine.run(TEXT_NEXT, use_cache=True), cold) > 1e-4


def test_mlx_lm_server_with_tap_is_bit_exact(lm: OpenAIEngine) -> None:
    lm.reset()
    assert check(lm, TEXT, exact_logits=True) == 0
    assert check(lm, TEXT, exact_logits=True) > 0
    assert check(lm, TEXT_NEXT, exact_logits=True) > 0
    assert lm.tap_disagreements == []
    out = lm.run(TEXT, use_cache=True)  # token ids rendered locally, as mlx-lm tokenizes
    assert out.token_ids is not None and len(out.token_ids) == out.prompt_tokens
    assert lm.render_mismatches == []


def test_tap_log_has_the_api_and_the_tap_reuse_per_request(
    lm: OpenAIEngine, tmp_path: Path
) -> None:
    readout = lm.readout
    lm.readout = dataclasses.replace(readout, tap_log=tmp_path / "tap.jsonl")
    try:
        lm.reset()
        lm.run(TEXT, use_cache=True)
        lm.run(TEXT, use_cache=False)
        lm.run(TEXT, use_cache=True)
    finally:
        lm.readout = readout
    lines = [json.loads(x) for x in (tmp_path / "tap.jsonl").read_text().splitlines()]
    assert [x["use_cache"] for x in lines] == [True, False, True]
    assert {x["prompt_tokens"] for x in lines} == {lines[0]["prompt_tokens"]} != {None}
    assert lines[0]["tap_reused_tokens"] == lines[1]["tap_reused_tokens"] == 0
    assert lines[2]["tap_reused_tokens"] > 0  # mlx_lm.server reports what the tap sees
    assert [x["api_cached_tokens"] for x in lines] == [x["tap_reused_tokens"] for x in lines]
    assert sum(x["disagreements"] for x in lines) == 0


def test_mlx_lm_refusals(lm: OpenAIEngine) -> None:
    with pytest.raises(EngineError, match="image support"):
        lm.run(IMAGE, use_cache=True)
    with pytest.raises(EngineError, match="namespace_header"):
        lm.run(req(*TEXT.messages, namespace="b"), use_cache=True)


@pytest.mark.xfail(
    strict=True,
    reason="mlx-lm 0.32.2: with top_logprobs > 0, logprobs.content[i] names the first element "
    "of an unsorted top-k (argpartition) instead of the sampled token",
)
def test_mlx_lm_content_names_the_sampled_token(lm: OpenAIEngine) -> None:
    assert isinstance(lm.server, ServerProcess)
    body = {
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": 5,
    }
    status, reply = http_json("POST", lm.server.url + "/v1/chat/completions", body)
    assert status == 200
    for step in reply["choices"][0]["logprobs"]["content"]:
        best = max(step["top_logprobs"], key=lambda t: t["logprob"])
        assert step["id"] == best["id"]


def test_mlx_vlm_server_apc_with_tap(vlm: OpenAIEngine) -> None:
    vlm.reset()
    assert check(vlm, TEXT, exact_logits=True) == 0
    assert check(vlm, TEXT, exact_logits=True) == 80
    assert check(vlm, IMAGE, exact_logits=True) == 0
    assert check(vlm, IMAGE_NEXT, exact_logits=True) == 0  # APC block mode: media prefix dropped
    assert vlm.tap_disagreements == []
    out = vlm.run(IMAGE, use_cache=True)  # token ids and image spans rendered locally
    assert out.image_spans == ((47, 63, A.digest),) and len(out.token_ids or ()) == 82
    assert vlm.render_mismatches == []


def test_a_server_that_dies_is_reported() -> None:
    cmd = [sys.executable, "-c", "import sys; print('boom', flush=True); sys.exit(3)"]
    with pytest.raises(EngineError, match=r"(?s)exited with 3 .*boom"):
        OpenAIEngine(cmd, cold="salt", namespace_header=NS, start_timeout=30)


def test_a_cold_baseline_that_reuses_is_refused(reference: OpenAIEngine) -> None:
    assert isinstance(reference.server, ServerProcess)
    url = reference.server.url
    engine = OpenAIEngine(url=url, cold="server", cold_url=url)
    engine.run(TEXT, use_cache=True)
    with pytest.raises(EngineError, match="uncached baseline reported cached_tokens="):
        engine.run(TEXT, use_cache=False)


def test_servers_are_stopped_by_pid_and_their_home_removed() -> None:
    cmd = "{python} -m reference_engine.server --host 127.0.0.1 --port {port}"
    engine = OpenAIEngine(cmd, cold="salt", namespace_header=NS)
    assert isinstance(engine.server, ServerProcess)
    proc, home = engine.server.proc, Path(engine.server.home)
    assert proc is not None and proc.poll() is None and home.is_dir()
    engine.close()
    assert proc.poll() is not None and not home.exists()


def test_from_env_builds_the_adapter_the_seed_script_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_prefixcache.adapters.presets import from_env

    env = {
        "PREFIXCACHE_SERVER_CMD": "{python} -m reference_engine.server --port {port}",
        "PREFIXCACHE_COLD": "salt",
        "PREFIXCACHE_NAMESPACE_HEADER": NS,
        "PREFIXCACHE_TOP_LOGPROBS": "20",
        "PREFIXCACHE_RENDER": f"vlm:{Path(__file__).parents[1] / 'fixtures' / 'tiny-qwen2-vl'}",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    engine = from_env()
    try:
        engine.run(IMAGE, use_cache=True)
        assert check(engine, IMAGE) == 81  # a repeat: all but the last of the 82 tokens
        out = engine.run(IMAGE, use_cache=True)
        assert out.image_spans == ((47, 63, A.digest),) and engine.render_mismatches == []
    finally:
        engine.close()
