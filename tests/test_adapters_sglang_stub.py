"""The sglang_server preset and the byte-named top_logprobs against a stub that answers like
SGLang 0.5.23 (tests/stub_sglang.py): entries named only by their raw ``bytes`` (byte
fragments that all display as U+FFFD included), ``response_token_ids``, ``cache_salt``,
``/flush_cache`` answering text, ``--enable-cache-report``, page-granular reuse; and the
negative controls (bytes of the display text, a flush that keeps the cache or is refused, a
corrupted cache hit, a decoded-text vocabulary)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from adapter_support import SYSTEM, req, user
from stub_sglang import LLAMA, llama_tokens, serve

from pytest_prefixcache import EngineError
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.http.replies import Vocabulary, parse_reply
from pytest_prefixcache.adapters.sglang import page_size_of, sglang_server
from pytest_prefixcache.checks import Tolerance, compare

STUB = Path(__file__).resolve().parent / "stub_sglang.py"
LONG = "Hello there, how are you today? Tell me a long story about cats and their habits. " * 2
TEXT = req(SYSTEM, user(LONG))


def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 488}))
    shutil.copy(LLAMA, tmp_path / "tokenizer.json")
    return tmp_path


def preset(tmp_path: Path, flags: tuple[str, ...] = (), **kw: object) -> OpenAIEngine:
    python = f"{sys.executable} {STUB}"
    return sglang_server(model_dir(tmp_path), flags, python=python, start_timeout=60, **kw)  # type: ignore[arg-type]


@pytest.fixture
def sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIEngine]:
    monkeypatch.setenv("STUB_ARGV_LOG", str(tmp_path / "argv.jsonl"))
    engine = preset(tmp_path, metrics=False)
    yield engine
    engine.close()


def argv_log(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text().splitlines()]


def test_raw_bytes_name_every_token_where_decoded_text_cannot() -> None:
    tokens = llama_tokens()
    by_bytes = Vocabulary(LLAMA.parent, kind="bytes")
    decoded = Vocabulary(LLAMA.parent)
    fragments = [(i, b) for i, b in tokens if len(b) == 1]
    assert len(fragments) == 32
    for i, raw in tokens:
        entry = {"token": raw.decode("utf-8", errors="replace"), "bytes": list(raw)}
        assert by_bytes(entry) == i
    # negative control: the decoded text of 32 different fragments is the same U+FFFD
    assert {decoded({"token": "\ufffd", "bytes": list(b)}) for _, b in fragments} == {None}
    # display-text bytes (a tokenizer that is not byte-level) are not guessed into an id
    assert by_bytes({"token": "\ufffd", "bytes": [0xEF, 0xBF, 0xBD]}) is None
    with pytest.raises(ValueError, match="vocabulary kind 'nope' is not one of"):
        Vocabulary(LLAMA.parent, kind="nope")


def test_a_tokenizer_that_is_not_byte_level_falls_back_to_decoded_text() -> None:
    gemma = Path(__file__).resolve().parent.parent / "fixtures" / "tiny-gemma3"
    vocab = Vocabulary(gemma, kind="bytes")
    assert vocab.raw_bytes == {} and vocab.names == Vocabulary(gemma).names


def test_the_preset_names_sglang_entries_and_reads_its_cache(
    sglang: OpenAIEngine, tmp_path: Path
) -> None:
    first = sglang.run(TEXT, use_cache=True)
    again = sglang.run(TEXT, use_cache=True)
    cold = sglang.run(TEXT, use_cache=False)
    n = again.prompt_tokens
    assert first.cached_tokens == 0 and cold.cached_tokens == 0
    assert n is not None and again.cached_tokens == n - 1  # token-granular, last token computed
    assert again.step_top_logprobs == cold.step_top_logprobs and again.tokens == cold.tokens
    assert all(len(s) == 20 for s in again.step_top_logprobs)  # every entry named
    ids = {i for i, _ in llama_tokens()}
    assert set(again.tokens) <= ids
    assert compare(again, cold, Tolerance()).problems == []
    assert again.token_ids is not None and len(again.token_ids) == n  # SGLang's prompt ids
    # the cold side is a server without a radix cache; both report cached tokens
    started = argv_log(tmp_path)
    assert len(started) == 2 and all("--enable-cache-report" in a for a in started)
    assert ["--disable-radix-cache" in a for a in started] == [False, True]
    assert all(
        a[a.index("--device") + 1] == "cpu" and a[a.index("--host") + 1] == "127.0.0.1"
        for a in started
    )


def test_namespaces_go_in_cache_salt(sglang: OpenAIEngine) -> None:
    sglang.run(req(*TEXT.messages, namespace="alice"), use_cache=True)
    assert sglang.run(req(*TEXT.messages, namespace="bob"), use_cache=True).cached_tokens == 0
    assert (
        sglang.run(req(*TEXT.messages, namespace="alice"), use_cache=True).cached_tokens or 0
    ) > 0


def test_pages_make_a_block_reference(tmp_path: Path) -> None:
    assert page_size_of(["--page-size", "16"]) == 16 and page_size_of(["--page-size=4"]) == 4
    assert page_size_of([]) == 1
    with pytest.raises(EngineError, match="--page-size 'x' is not a positive int"):
        page_size_of(["--page-size", "x"])
    engine = preset(tmp_path, ("--page-size", "16"), metrics=False)
    try:
        assert (engine.reuse_reference, engine.block_size) == ("block", 16)
        engine.run(TEXT, use_cache=True)
        hit = engine.run(TEXT, use_cache=True)
        assert hit.prompt_tokens is not None
        assert hit.cached_tokens == (hit.prompt_tokens - 1) // 16 * 16
    finally:
        engine.close()
    plain = OpenAIEngine(url="http://127.0.0.1:9", cold="salt", namespace_field="cache_salt")
    assert plain.reuse_reference == "token"


def test_the_flushed_baseline_proves_itself_cold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = preset(tmp_path, cold="reset", metrics=False)
    try:
        engine.run(TEXT, use_cache=False)
        assert engine.run(TEXT, use_cache=False).cached_tokens == 0  # flushed in between
    finally:
        engine.close()
    # negative controls: a flush that keeps the cache, a flush that is refused
    monkeypatch.setenv("STUB_FAULT", "flush_noop")
    engine = preset(tmp_path, cold="reset", metrics=False)
    try:
        engine.run(TEXT, use_cache=False)
        with pytest.raises(EngineError, match=r"the uncached baseline reported cached_tokens=\d+"):
            engine.run(TEXT, use_cache=False)
    finally:
        engine.close()
    monkeypatch.setenv("STUB_FAULT", "flush_refused")
    engine = preset(tmp_path, cold="reset", metrics=False)
    try:
        engine.run(TEXT, use_cache=False)
        with pytest.raises(EngineError, match=r"the cache reset POST /flush_cache .* 400"):
            engine.run(TEXT, use_cache=False)
    finally:
        engine.close()


def test_bytes_of_the_display_text_are_a_fault_not_a_guess(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STUB_FAULT", "display_bytes")
    engine = preset(tmp_path, cold="salt", metrics=False)
    try:
        with pytest.raises(EngineError, match=r"top_logprobs entr(y|ies) name no token id"):
            for _ in range(3):  # some step's top 20 holds a fragment
                engine.run(TEXT, use_cache=True)
    finally:
        engine.close()


def test_a_bad_cold_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="cold='nope' is not one of server, reset, salt"):
        preset(tmp_path, cold="nope")


def test_sglang_reply_shapes_parse() -> None:
    srv = serve()
    try:
        engine = OpenAIEngine(
            url=f"http://127.0.0.1:{srv.server_address[1]}",
            cold="salt",
            namespace_field="cache_salt",
            vocab=Vocabulary(LLAMA.parent, kind="bytes"),
            prompt_ids="reply",
        )
        out = engine.run(TEXT, use_cache=True)
        assert len(out.tokens) == TEXT.max_new_tokens and out.token_ids is not None
    finally:
        srv.shutdown()
        srv.server_close()
    body = {"choices": [{"logprobs": None, "response_token_ids": [5, 6]}], "usage": {}}
    assert parse_reply(body).completion_token_ids == (5, 6)


def test_cached_tokens_and_the_metric_are_both_claims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_prefixcache.checks.claims import claim_problems

    def figures(fault: str) -> list[tuple[str, int | None]]:
        monkeypatch.setenv("STUB_FAULT", fault)
        engine = preset(tmp_path, cold="salt")
        try:
            engine.run(TEXT, use_cache=True)
            out = engine.run(TEXT, use_cache=True)
        finally:
            engine.close()
        assert out.claims is not None and out.cached_tokens
        problems = [p.headline for p in claim_problems(out)]
        assert bool(problems) == (fault != ""), problems
        return [(c.source, c.value) for c in out.claims.reuse]

    honest = figures("")
    assert [s for s, _ in honest] == [
        "API usage.prompt_tokens_details.cached_tokens",
        "metric sglang:cached_tokens_total (delta)",
    ]
    assert honest[0][1] == honest[1][1] and (honest[0][1] or 0) > 0
    lying = figures("metric_overclaims")  # negative control: the counter says 4 more
    assert lying[1][1] == (lying[0][1] or 0) + 4


RESULTS = Path(__file__).resolve().parent.parent / "engines" / "sglang" / "results"


def test_the_measured_rule_is_named_and_clears_the_smallest_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_prefixcache.adapters.tolerances import engine_atol, engine_rule

    atol = engine_atol("sglang", "llama")
    assert atol == engine_atol("sglang", "qwen2_vl") == 2e-5
    assert engine_rule("sglang", "llama").startswith("sglang llama: cached and cold runs")
    assert engine_atol("nope", "llama") is None and engine_rule("nope", "llama") == ""
    figures = json.loads((RESULTS / "tolerance.json").read_text())
    assert figures["cached_vs_cold_worst"] * 5 < atol  # the rule covers what was measured
    assert figures["one_token_bug_smallest"] > 100 * atol  # and no real bug
    engine = preset(tmp_path, metrics=False)
    assert (engine.atol, engine.tolerance_rule) == (atol, engine_rule("sglang", "llama"))
    engine.close()

    def verdict(shift: float) -> list[str]:
        monkeypatch.setenv("STUB_CORRUPT", repr(shift))
        monkeypatch.setenv("STUB_FAULT", "corrupt")
        engine = preset(tmp_path, cold="salt", metrics=False)
        try:
            engine.run(TEXT, use_cache=True)
            cached = engine.run(TEXT, use_cache=True)
            cold = engine.run(TEXT, use_cache=False)
        finally:
            engine.close()
        assert (cached.cached_tokens or 0) > 0 and cached.tokens == cold.tokens
        return [p.headline for p in compare(cached, cold, Tolerance(atol=engine.atol)).problems]

    # positive control: SGLang's worst measured cached-vs-cold difference passes the rule
    assert verdict(figures["cached_vs_cold_worst"]) == []
    # negative control: the smallest one-token cache bug measured is still caught
    caught = verdict(figures["one_token_bug_smallest"])
    assert caught == ["logits differ beyond the tolerance (atol=2e-05, rtol=0) at 1 of 3 step(s)"]
