"""The llama_server preset against a stub that answers like llama-server
(tests/stub_openai.py): ids on every entry, ``timings.cache_n``, a ``tokens_cached`` that is
the whole prompt (not reuse), ``/apply-template`` + ``/tokenize``, no reset endpoint, a
cache-less second server as the cold baseline."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from adapter_support import SYSTEM, img, req, user
from stub_openai import template, tokenize_text

from pytest_prefixcache import EngineError
from pytest_prefixcache.adapters.http.chat import openai_messages
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.http.server import ServerProcess
from pytest_prefixcache.adapters.presets import llama_server

STUB = Path(__file__).resolve().parent / "stub_openai.py"
TEXT = req(SYSTEM, user("Hello there, how are you today? Tell me a long story about cats. " * 2))
IMAGE = req(SYSTEM, user(img(1), "What is in this image? " * 3))


def preset(mmproj: str | None = None, **kw: object) -> OpenAIEngine:
    binary = f"{sys.executable} {STUB} --flavour llama"
    return llama_server("tiny.gguf", mmproj, binary=binary, start_timeout=60, **kw)  # type: ignore[arg-type]


@pytest.fixture
def llama() -> Iterator[OpenAIEngine]:
    engine = preset("mmproj.gguf")
    yield engine
    engine.close()


def test_the_preset_reads_llama_server_shapes(llama: OpenAIEngine) -> None:
    assert isinstance(llama.cold_server, ServerProcess)
    assert "--no-cache-prompt" in llama.cold_server.cmd and "--mmproj" in llama.cold_server.cmd
    assert llama.atol > 0
    llama.run(TEXT, use_cache=True)
    hit = llama.run(TEXT, use_cache=True)
    cold = llama.run(TEXT, use_cache=False)
    n = hit.prompt_tokens
    # cached_tokens is the reuse (timings.cache_n), never tokens_cached (the whole prompt)
    assert n is not None and hit.cached_tokens == (n - 1) // 32 * 32 and 0 < n - 32
    assert cold.cached_tokens == 0 and cold.tokens == hit.tokens
    assert hit.step_top_logprobs == cold.step_top_logprobs and len(hit.step_top_logprobs) == 3
    # the oracle gets llama-server's own ids: its template, then its tokenizer
    expected = tokenize_text(template(openai_messages(TEXT)))
    assert hit.token_ids == tuple(expected) and hit.image_spans == ()
    image = llama.run(IMAGE, use_cache=True)  # /tokenize cannot expand images: no ids here
    assert image.token_ids is None and image.prompt_tokens is not None


def test_reset_restarts_a_server_without_a_reset_endpoint(llama: OpenAIEngine) -> None:
    assert isinstance(llama.server, ServerProcess)
    llama.run(TEXT, use_cache=True)
    before = llama.server.proc
    llama.reset()
    assert llama.server.proc is not before
    assert llama.run(TEXT, use_cache=True).cached_tokens == 0
    llama.reset()  # nothing was sent since the restart: no second restart
    assert llama.run(TEXT, use_cache=True).cached_tokens == 0


def test_a_text_only_preset_refuses_images() -> None:
    engine = preset()
    try:
        with pytest.raises(EngineError, match="without image support"):
            engine.run(IMAGE, use_cache=True)
    finally:
        engine.close()


def test_short_logprobs_from_llama_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUB_FAULT", "short")
    engine = preset()
    try:
        with pytest.raises(EngineError, match=r"2 logprobs entries for usage.completion_tokens=3"):
            engine.run(TEXT, use_cache=True)
    finally:
        engine.close()
