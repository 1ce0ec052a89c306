"""The llama_server preset against a stub that answers like llama-server
(tests/stub_openai.py): ids on every entry, ``timings.cache_n``, a ``tokens_cached`` that is
the whole prompt (not reuse), ``/apply-template`` + ``/tokenize``, no reset endpoint, a
cache-less second server as the cold baseline."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from adapter_support import SYSTEM, img, req, user
from stub_openai import template, tokenize_text

from pytest_prefixcache import EngineError, EquivalenceFailure, Verifier
from pytest_prefixcache.adapters.http.chat import openai_messages
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.http.server import ServerProcess
from pytest_prefixcache.adapters.llama import cold_command
from pytest_prefixcache.adapters.presets import llama_server
from pytest_prefixcache.types import Wave
from pytest_prefixcache.verify.concurrent import CONCURRENT

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


def test_a_combination_s_flags_reach_the_server_and_the_cold_one_drops_the_cache_s() -> None:
    flags = ["-np 3", "--cache-reuse 4", "-sps", "0", "--cache-ram=0", "--no-cache-idle-slots"]
    engine = preset(flags=flags)
    try:
        assert isinstance(engine.server, ServerProcess)
        assert isinstance(engine.cold_server, ServerProcess)
        cmd, cold = list(engine.server.cmd), list(engine.cold_server.cmd)
        words = ["-np", "3", "--cache-reuse", "4", "-sps", "0", "--cache-ram=0"]
        assert cmd[-8:] == [*words, "--no-cache-idle-slots"]
        assert "-fa" in cmd and cmd[cmd.index("-fa") + 1] == "off"  # the preset's exact default
        # the cold server: the same slots, none of the cache-only flags, no cache at all
        for word in ("--cache-reuse", "-sps", "--cache-ram=0", "--no-cache-idle-slots", "4"):
            assert word not in cold, (word, cold)
        assert cold[cold.index("-np") + 1] == "3" and cold.count("-np") == 1
        assert cold[-3:] == ["--no-cache-prompt", "--cache-ram", "0"]
        # -np 3: three requests at once (the waves); no claims, which read one request at a time
        assert engine.max_concurrency == 3 and engine.readout.claims is None
    finally:
        engine.close()


@pytest.mark.parametrize(
    "flags, atol, rule",
    [
        ((), 1e-4, "flash attention off, f32 KV"),
        (("-fa on",), 2e-2, "flash attention or f16/q KV"),
        (("--flash-attn=auto",), 2e-2, "flash attention or f16/q KV"),
        (("-ctk q8_0 -ctv q8_0",), 2e-2, "flash attention or f16/q KV"),  # -fa off, q8_0 KV
    ],
    ids=["exact", "fa-on", "fa-auto", "q8-kv"],
)
def test_the_tolerance_rule_follows_flash_attention_and_the_kv_type(
    flags: tuple[str, ...], atol: float, rule: str
) -> None:
    engine = preset(flags=flags)
    try:
        assert engine.atol == atol and rule in engine.tolerance_rule
        assert isinstance(engine.server, ServerProcess)
        cmd = list(engine.server.cmd)
        # the flags decide: the preset's own -fa/-ctk/-ctv never contradict them
        assert cmd.count("-fa") + cmd.count("--flash-attn=auto") == 1
        assert cmd.count("--cache-type-k") + cmd.count("-ctk") == 1
    finally:
        engine.close()
    assert preset(atol=0.0).atol == 0.0  # an explicit atol wins (the negative control's)


def test_claims_compare_cached_tokens_cache_n_and_the_counter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pytest_prefixcache.checks.claims import claim_problems

    def figures(fault: str) -> tuple[list[tuple[str, int | None]], list[str]]:
        monkeypatch.setenv("STUB_FAULT", fault)
        engine = preset(claims=True)
        try:
            assert isinstance(engine.server, ServerProcess) and "--metrics" in engine.server.cmd
            engine.run(TEXT, use_cache=True)
            out = engine.run(TEXT, use_cache=True)
        finally:
            engine.close()
        assert out.claims is not None and out.cached_tokens
        problems = [p.headline for p in claim_problems(out)]
        return [(c.source, c.value) for c in out.claims.reuse], problems

    honest, problems = figures("")
    assert [s for s, _ in honest] == [
        "API usage.prompt_tokens_details.cached_tokens",
        "API timings.cache_n",
        "metric llamacpp:prompt_tokens_cached_total (delta)",
    ]
    assert len({v for _, v in honest}) == 1 and (honest[0][1] or 0) > 0 and not problems
    lying, problems = figures("cache_n_overclaims")  # negative control: cache_n says 4 more
    assert lying[1][1] == (lying[0][1] or 0) + 4
    assert problems and "timings.cache_n" in " ".join(problems), problems


def test_claims_are_refused_with_slots_that_serve_requests_at_once() -> None:
    with pytest.raises(EngineError, match="claims with concurrency=2"):
        preset(flags=["-np", "2"], claims=True)


def _waves() -> tuple[Wave, ...]:
    ask = [req(SYSTEM, user(f"Question {i}: tell me about cats and dogs."), max_new_tokens=2)
           for i in range(3)]  # fmt: skip
    return (Wave((ask[0], ask[1], ask[0])), Wave((ask[2], ask[0], ask[1]), (0, 0.005, 0.01)))


def test_slots_make_the_verifier_send_waves(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = preset(flags=["-np", "3"])
    try:
        verifier = Verifier(engine)
        verifier.run_waves(_waves())
        assert verifier.report.cache_hits >= 1
        assert sum(verifier.report.coverage[CONCURRENT].values()) == 6
    finally:
        engine.close()
    monkeypatch.setenv("STUB_FAULT", "corrupt")  # negative control: hits answered wrongly
    engine = preset(flags=["-np", "3"])
    try:
        with pytest.raises(EquivalenceFailure, match=r"wave \d, cache: .*: logits differ"):
            Verifier(engine).run_waves(_waves())
    finally:
        engine.close()


def test_the_cold_server_keeps_the_context_checkpoints() -> None:
    """Checkpoints change a sliding-window model's prefill (engines/llama findings): the cold
    server takes the same ones as the cached server, where the cache-only flags go."""
    engine = preset(flags=["-ctxcp 0", "-cms=0", "--cache-reuse=4"])
    try:
        assert isinstance(engine.cold_server, ServerProcess)
        cold = list(engine.cold_server.cmd)
        assert cold[cold.index("-ctxcp") + 1] == "0" and "-cms=0" in cold
        assert "--cache-reuse=4" not in cold
    finally:
        engine.close()


def test_sampled_tokens_are_the_entries_own_ids_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A grammar makes the sampled token differ from the raw argmax: with ``sampled_tokens``
    the Outcome carries the ids the server generated (what a closed-loop prompt carries back);
    without it, the argmax (the negative control: the two differ on this stub)."""
    monkeypatch.setenv("STUB_FAULT", "sampled_second")
    engine = preset()
    try:
        engine.readout = dataclasses.replace(engine.readout, check_labels=False)
        argmax = engine.run(TEXT, use_cache=False)
        engine.sampled_tokens = True
        sampled = engine.run(TEXT, use_cache=False)
    finally:
        engine.close()
    assert len(sampled.tokens) == len(argmax.tokens) == 3
    for step, (a, b) in enumerate(zip(argmax.tokens, sampled.tokens, strict=True)):
        top = sorted(argmax.step_top_logprobs[step].items(), key=lambda kv: -kv[1])
        assert a == top[0][0] and b == top[1][0] and a != b


def test_the_cold_server_decodes_without_speculation() -> None:
    """A draft model (``-md``) and its settings are dropped from the cold command, in either
    spelling, so the baseline is the same request decoded without speculation; the flags
    around them stay."""
    cmd = ["llama-server", "-m", "t.gguf", "-md", "d.gguf", "--spec-type=draft-simple"]
    cmd += ["--spec-draft-n-max", "4", "-ub", "16", "--lora", "a.gguf"]
    cold = cold_command(cmd)
    assert cold == [
        "llama-server", "-m", "t.gguf", "-ub", "16", "--lora", "a.gguf",
        "-np", "1", "--no-cache-prompt", "--cache-ram", "0",
    ]  # fmt: skip
    # the control: without speculation flags nothing but the cache-less defaults is added
    assert cold_command(cmd[:3]) == [*cmd[:3], "-np", "1", "--no-cache-prompt", "--cache-ram", "0"]
