"""The vllm_server preset and the HTTP adapter against a stub that answers like vLLM
(tests/stub_openai.py): entries without ids, ``''`` tokens, ``token_id:N``,
``prompt_token_ids``, ``cache_salt``, reset bodies, null logprobs; and the negative controls
(shifted, short, a reset that says success false, a salt that is ignored, a corrupted step)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from adapter_support import SYSTEM, assistant, img, req, user
from stub_openai import PAD, serve, url_of

from pytest_prefixcache import EngineError
from pytest_prefixcache.adapters.http.config import FIELDS
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.presets import VLLM_RESETS, vllm_server
from pytest_prefixcache.checks import Tolerance, compare

pytest_plugins = ["pytester"]

STUB = Path(__file__).resolve().parent / "stub_openai.py"
LONG = "Hello there, how are you today? Tell me a long story about cats and their habits. " * 2
TEXT = req(SYSTEM, user(LONG))
TEXT_NEXT = req(*TEXT.messages, assistant("fine"), user("and now?"))
A, B = img(1), img(2)
IMAGE = req(SYSTEM, user(A, "What is in this image? " * 3))
IMAGE_B = req(SYSTEM, user(B, "What is in this image? " * 3))


def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 264, "image_token_id": PAD}))
    return tmp_path


def preset(tmp_path: Path, **kw: object) -> OpenAIEngine:
    python = f"{sys.executable} {STUB} --flavour vllm"
    return vllm_server(model_dir(tmp_path), python=python, start_timeout=60, **kw)  # type: ignore[arg-type]


@pytest.fixture
def vllm(tmp_path: Path) -> Iterator[OpenAIEngine]:
    engine = preset(tmp_path)
    yield engine
    engine.close()


def faulty(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fault: str) -> OpenAIEngine:
    monkeypatch.setenv("STUB_FAULT", fault)
    return preset(tmp_path)


def test_the_preset_reads_ids_salts_and_spans_from_vllm_shapes(vllm: OpenAIEngine) -> None:
    first = vllm.run(TEXT, use_cache=True)
    again = vllm.run(TEXT, use_cache=True)
    cold = vllm.run(TEXT, use_cache=False)
    assert first.cached_tokens == 0 and cold.cached_tokens == 0
    n = again.prompt_tokens
    assert n is not None and again.cached_tokens == (n - 1) // 32 * 32 > 0
    # token_id:N names every entry; every decode step is there, cached equal to uncached
    assert len(again.step_top_logprobs) == 3 and again.tokens == cold.tokens
    assert all(len(s) == 20 for s in again.step_top_logprobs)
    assert again.step_top_logprobs == cold.step_top_logprobs
    assert compare(again, cold, Tolerance()).problems == []
    # the oracle gets vLLM's own prompt ids (return_token_ids)
    assert again.token_ids is not None and len(again.token_ids) == n
    out = vllm.run(IMAGE, use_cache=True)
    assert out.token_ids is not None and out.image_spans is not None
    ((s, e, digest),) = out.image_spans
    assert (e - s, digest) == (4, A.digest) and set(out.token_ids[s:e]) == {PAD}


def test_namespaces_and_the_cold_salt_go_in_cache_salt(vllm: OpenAIEngine) -> None:
    vllm.run(req(*TEXT.messages, namespace="alice"), use_cache=True)
    assert vllm.run(req(*TEXT.messages, namespace="bob"), use_cache=True).cached_tokens == 0
    hit = vllm.run(req(*TEXT.messages, namespace="alice"), use_cache=True)
    assert (hit.cached_tokens or 0) > 0
    assert vllm.run(req(*TEXT.messages, namespace="alice"), use_cache=False).cached_tokens == 0


def test_reset_calls_every_endpoint_and_empties_the_cache(vllm: OpenAIEngine) -> None:
    assert [str(e) for e in vllm.resets] == list(VLLM_RESETS)
    vllm.run(TEXT, use_cache=True)
    assert (vllm.run(TEXT, use_cache=True).cached_tokens or 0) > 0
    vllm.reset()
    assert vllm.run(TEXT, use_cache=True).cached_tokens == 0


def test_a_server_that_warms_its_own_cache_is_reset_before_its_first_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that sends itself a request at start (rapid-mlx 0.16.10 on hybrid models) has
    a cache before the first stream: ``warm_start=True`` resets it; without it, the first
    request reuses what no earlier request put there (the negative control)."""
    system, user_text = (m.content[0] for m in TEXT.messages)
    body = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user_text}]
    }
    monkeypatch.setenv("STUB_WARM", json.dumps({**body, "max_tokens": 1}))
    cmd = [sys.executable, str(STUB), "--flavour", "vllm", "--port", "{port}"]
    reused = {}
    for warm_start in (False, True):
        engine = OpenAIEngine(
            cmd,
            cold="salt",
            namespace_field="cache_salt",
            reset_paths=VLLM_RESETS,
            extra_body={"return_tokens_as_token_ids": True},
            prompt_ids="reply",
            image_token_id=PAD,
            start_timeout=60,
            warm_start=warm_start,
        )
        try:
            engine.reset()  # what the verifier does before every stream
            reused[warm_start] = engine.run(TEXT, use_cache=True).cached_tokens
            assert (engine.run(TEXT, use_cache=True).cached_tokens or 0) > 0  # positive control
        finally:
            engine.close()
    assert reused[True] == 0 and (reused[False] or 0) > 0, reused


def test_the_fresh_instance_is_a_new_cold_server(vllm: OpenAIEngine, tmp_path: Path) -> None:
    vllm.run(TEXT, use_cache=True)
    fresh = vllm.fresh_instance()
    try:
        assert fresh.server is not vllm.server and fresh.server is fresh.cold_server
        # the copy's baseline is a replaced group: the original keeps its own, no field is copied
        assert (fresh.baseline.cold, vllm.baseline.cold) == ("server", "salt")
        assert not FIELDS.keys() & vars(fresh).keys()
        out = fresh.run(TEXT, use_cache=False)
        assert out.cached_tokens == 0 and out.tokens == vllm.run(TEXT, use_cache=True).tokens
    finally:
        fresh.close()
    assert vllm.supports_fresh_instances
    with pytest.raises(EngineError, match="cold='reset' needs a second server"):
        OpenAIEngine(url="http://127.0.0.1:9")
    by_url = OpenAIEngine(url="http://127.0.0.1:9", cold="server", cold_url="http://127.0.0.1:9")
    assert not by_url.supports_fresh_instances and "URL" in by_url.fresh_instances_missing
    off = preset(tmp_path, audit=False)
    try:
        assert not off.supports_fresh_instances and "switched off" in off.fresh_instances_missing
    finally:
        off.close()


NEGATIVE = [
    ("shifted", r"decode step 0: the server's token \d+ \(logprob .*\) is not the best of this "
     r"step's top_logprobs .*logprobs shifted"),
    ("short", r"2 logprobs entries for usage.completion_tokens=3 \(the last entry: .*\)"),
    ("null_logprobs", r"the reply has no logprobs \(logprobs: null\)"),
    ("reset_false", r"the cache reset POST /reset_prefix_cache of http://127.0.0.1:\d+ failed: "
     r"it answered 200 but its body says it did not reset: \{'success': False\}"),
]  # fmt: skip


@pytest.mark.parametrize(("fault", "message"), NEGATIVE, ids=[n[0] for n in NEGATIVE])
def test_a_broken_vllm_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fault: str, message: str
) -> None:
    engine = faulty(monkeypatch, tmp_path, fault)
    try:
        with pytest.raises(EngineError, match=message):
            engine.run(TEXT, use_cache=True)
            engine.reset()
    finally:
        engine.close()


def test_a_salt_the_server_ignores_is_caught(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    engine = faulty(monkeypatch, tmp_path, "ignores_salt")
    try:
        engine.run(TEXT, use_cache=True)
        with pytest.raises(EngineError, match=r"the uncached baseline reported cached_tokens=\d+"):
            engine.run(TEXT, use_cache=False)
    finally:
        engine.close()


def test_a_difference_at_a_later_decode_step_is_compared(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Negative control for every-step comparison: only step 2's logprobs differ on a hit."""
    engine = faulty(monkeypatch, tmp_path, "corrupt_step2")
    try:
        engine.run(TEXT, use_cache=True)
        cached = engine.run(TEXT, use_cache=True)
        cold = engine.run(TEXT, use_cache=False)
    finally:
        engine.close()
    assert cached.tokens == cold.tokens and cached.top_logprobs == cold.top_logprobs
    problems = compare(cached, cold, Tolerance()).problems
    assert problems and "at 1 of 3 step(s)" in problems[0].headline
    assert "step 2 (before new token 2)" in problems[0].details[0]


def printable(entry: dict[str, Any]) -> int | None:
    return ord(entry["token"]) if len(entry["token"]) == 1 else None


def test_entries_named_empty_are_a_fault_without_token_ids() -> None:
    """vLLM names special and byte tokens '': without token_id:N they cannot be compared."""
    srv = serve("vllm")
    try:
        engine = OpenAIEngine(url=url_of(srv), cold="salt", namespace_field="cache_salt")
        # a vocabulary that names every printable token (what Vocabulary does with tokenizer.json)
        engine.readout = dataclasses.replace(engine.readout, vocab=printable)
        with pytest.raises(EngineError, match=r"decode step \d+: \d+ top_logprobs entr(y|ies) "
                           r"name no token id, e.g. \{'token': '', 'logprob': [-.0-9]+, "
                           r"'bytes': \[\]\} .*return_tokens_as_token_ids"):  # fmt: skip
            engine.run(TEXT, use_cache=True)
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_render_that_disagrees_with_the_server_is_a_fault() -> None:
    srv = serve("vllm")
    try:
        engine = OpenAIEngine(
            url=url_of(srv),
            cold="salt",
            namespace_field="cache_salt",
            prompt_ids="reply",
            extra_body={"return_tokens_as_token_ids": True},
            render=lambda r: ([1, 2, 3], ()),
        )
        wrong = r"the local render of the request disagrees with the server's prompt token ids: "
        with pytest.raises(EngineError, match=wrong + "first difference at position 0"):
            engine.run(TEXT, use_cache=True)
        assert len(engine.render_mismatches) == 1
    finally:
        srv.shutdown()
        srv.server_close()


ENGINES = """
import json, pathlib, sys
from pytest_prefixcache.adapters.presets import vllm_server

HERE = pathlib.Path(__file__).parent
(HERE / "config.json").write_text(json.dumps({"vocab_size": 264, "image_token_id": 262}))


def vllm():
    python = f"{sys.executable} STUB --flavour vllm"
    return vllm_server(HERE, python=python, start_timeout=60)
"""


def _suite(pytester: pytest.Pytester, *extra: str) -> pytest.RunResult:
    pytester.makepyfile(stubengines=ENGINES.replace("STUB", str(STUB)))
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-engine=stubengines:vllm",
        "--prefixcache-examples=5", "--prefixcache-seed=1", "--prefixcache-allow-partial",
        "-k", "request_streams", *extra, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_the_suite_audits_the_salted_baseline_with_fresh_servers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The built-in suite through the preset: every decode step compared, the salted cold
    baseline audited by fresh servers; only shapes (no merges over HTTP) are left partial."""
    monkeypatch.delenv("STUB_FAULT", raising=False)
    result = _suite(pytester)
    result.stdout.fnmatch_lines(
        [
            "failures by check: none",
            "  equivalence at decode steps  [1-9]*/[1-9]*",
            "  reuse bound * [1-9]*/[1-9]*",
            "  cold baseline * [1-9]*/[1-9]*",
            "verdict: PASS (partial: not checked on every request: shapes)",
        ]
    )
    assert "not audited" not in result.stdout.str() and result.ret == 0


@pytest.mark.slow
def test_the_suite_fails_a_vllm_whose_hits_change_a_later_step(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STUB_FAULT", "corrupt_step2")
    result = _suite(pytester)
    result.stdout.fnmatch_lines(["*failures by check: equivalence*"])
    assert result.ret == 1


VLLM_ENV = {
    "PREFIXCACHE_COLD": "salt",
    "PREFIXCACHE_NAMESPACE_FIELD": "cache_salt",
    "PREFIXCACHE_PROMPT_IDS": "reply",
    "PREFIXCACHE_IMAGE_TOKEN_ID": str(PAD),
    "PREFIXCACHE_RESET_PATHS": ",".join(VLLM_RESETS),
}


@pytest.mark.parametrize("body", [True, False], ids=["token-ids", "no-body"])
@pytest.mark.slow
def test_server_cmd_with_a_request_body_option(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, body: bool
) -> None:
    """``--prefixcache-server-cmd`` plus PREFIXCACHE_* settings verify a vLLM-shaped server;
    without ``return_tokens_as_token_ids`` (the body option) its '' entries are a named fault."""
    monkeypatch.delenv("STUB_FAULT", raising=False)
    for k, v in VLLM_ENV.items():
        monkeypatch.setenv(k, v)
    extra = ['--prefixcache-server-body={"return_tokens_as_token_ids": true}'] if body else []
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-allow-partial",
        f"--prefixcache-server-cmd={sys.executable} {STUB} --flavour vllm --port {{port}}",
        "--prefixcache-examples=3", "--prefixcache-seed=1", "-k", "request_streams", *extra,
        timeout=300,
    )  # fmt: skip
    if body:
        result.stdout.fnmatch_lines(["failures by check: none", "  cold baseline * [1-9]*/[1-9]*"])
        assert result.ret == 0
    else:
        result.stdout.fnmatch_lines(["*top_logprobs entr* name no token id*"])
        assert result.ret == 1


@pytest.mark.slow
def test_a_request_body_option_is_checked(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--prefixcache-server-body=[1]")
    result.stderr.fnmatch_lines(["*argument --prefixcache-server-body: * is not a JSON object*"])
    result = pytester.runpytest_subprocess('--prefixcache-server-body={"a": 1}')
    result.stderr.fnmatch_lines(["*--prefixcache-server-body needs --prefixcache-server-cmd*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


@pytest.mark.slow
def test_prefixcache_verify_takes_the_request_body_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import subprocess

    env = {**os.environ, **VLLM_ENV, "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("STUB_FAULT", None)

    def verify(*body: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest_prefixcache.cli", "verify", "--allow-partial",
             "--server-cmd", f"{sys.executable} {STUB} --flavour vllm --port {{port}}", *body,
             "--examples", "2", "--seed", "1", "--database", "none", "--out", str(tmp_path)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    res = verify("--server-body", '{"return_tokens_as_token_ids": true}')
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    res = verify()  # without token_id:N, vLLM's '' entries are a fault
    assert res.returncode == 1 and "name no token id" in res.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "pytest_prefixcache.cli", "verify", "--server-body", "[1]"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "is not a JSON object" in bad.stderr


def test_replays_carry_the_request_body() -> None:
    from pytest_prefixcache.session.settings import Settings

    s = Settings(server_cmd="srv --port {port}", server_body='{"a": 1}')
    assert "'--prefixcache-server-body={\"a\": 1}'" in s.replay_command("f/stream.json")
