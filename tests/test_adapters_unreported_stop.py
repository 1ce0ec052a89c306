"""A reply that stopped before its first token without reporting it (mlx_lm.server 0.31.2:
``finish_reason "stop"``, ``usage.completion_tokens`` 0, no logprobs, when the greedy first
token is <eos>) is neither a fault nor silently passed: both sides stopped -> equal, the
equivalence row counts the request as not compared with the reason; one side stopped ->
greedy tokens differ at new token 0; a reply with tokens but no logprobs is still a fault.

The stub is in process: two servers (cached and cold) on ephemeral ports that answer like
mlx_lm.server 0.31.2 (top_logprobs entries with ``id``), a request whose last message holds
``STOP`` answered in the shape its ``mode`` names."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from adapter_support import SYSTEM, req, user

from pytest_prefixcache import EngineError
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.http.replies import (
    logprob_problems,
    parse_reply,
    stopped_unreported,
)
from pytest_prefixcache.checks.coverage import BOTH_STOPPED, missing
from pytest_prefixcache.errors import EngineFault, EquivalenceFailure
from pytest_prefixcache.types import Wave
from pytest_prefixcache.verify.verifier import Verifier

ASK = req(SYSTEM, user("Tell me about cats."), max_new_tokens=3)
STOP = req(SYSTEM, user("Tell me about cats. STOP"), max_new_tokens=3)
STREAM = (ASK, STOP, ASK, STOP)


def _steps(prompt: str, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        seed = hashlib.sha256(f"{prompt}|{i}".encode()).digest()
        ids = [32 + seed[j] % 90 + 100 * j for j in range(6)]
        top = [{"id": t, "token": f"t{t}", "logprob": -0.1 - 0.5 * j} for j, t in enumerate(ids)]
        out.append({**top[0], "top_logprobs": top})
    return out


def reply(body: dict[str, Any], mode: str) -> dict[str, Any]:
    """The stub's answer: ``mode`` is how a ``STOP`` request is answered (``"stop"``: 0
    tokens, no logprobs, as mlx_lm.server 0.31.2; ``"answer"``: like any other request;
    ``"no-logprobs"``: 2 tokens reported, no logprobs)."""
    prompt = json.dumps(body["messages"])
    n = int(body["max_tokens"])
    usage = {"prompt_tokens": len(prompt), "completion_tokens": n}
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if "STOP" in prompt and mode != "answer":
        usage["completion_tokens"] = 0 if mode == "stop" else 2
        choice.update(finish_reason="stop", message={"role": "assistant", "content": ""})
    else:
        choice.update(
            message={"role": "assistant", "content": "x" * n},
            logprobs={"content": _steps(prompt, n)},
        )
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return {"id": "chatcmpl-stub", "object": "chat.completion", "choices": [choice], "usage": usage}


@contextmanager
def stub(mode: str) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, obj: object) -> None:
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send({"object": "list", "data": [{"id": "stub"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)) or b"{}")
            chat = self.path.startswith("/v1/chat/completions")
            self._send(reply(body, mode) if chat else {})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def engine(cached_mode: str, cold_mode: str, concurrency: int = 1) -> Iterator[OpenAIEngine]:
    with stub(cached_mode) as warm, stub(cold_mode) as cold:
        eng = OpenAIEngine(
            url=warm, cold="server", cold_url=cold, top_logprobs=6, concurrency=concurrency
        )
        try:
            yield eng
        finally:
            eng.close()


@pytest.fixture(autouse=True)
def _failures_in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The verifier saves a failing stream under .prefixcache/ in the working directory."""
    monkeypatch.chdir(tmp_path)


def test_a_zero_token_stop_is_read_as_an_unreported_stop() -> None:
    stopped = parse_reply(reply({"messages": ["STOP"], "max_tokens": 3}, "stop"))
    assert stopped_unreported(stopped, 3) and logprob_problems(stopped, 3) == []
    assert not stopped_unreported(stopped, 0)  # asked for no token: nothing to explain
    # negative controls: tokens reported without logprobs, or a stop for another reason
    two = parse_reply(reply({"messages": ["STOP"], "max_tokens": 3}, "no-logprobs"))
    assert not stopped_unreported(two, 3)
    assert logprob_problems(two, 3)[0].startswith("the reply has no logprobs")
    raw = reply({"messages": ["STOP"], "max_tokens": 3}, "stop")
    raw["choices"][0]["finish_reason"] = "length"
    assert not stopped_unreported(parse_reply(raw), 3) and logprob_problems(parse_reply(raw), 3)


def test_both_sides_stopping_at_once_pass_and_the_coverage_names_it() -> None:
    with engine("stop", "stop") as eng:
        out = eng.run(STOP, use_cache=True)
        assert out.unreported_stop and out.tokens == () and out.top_logprobs is None
        assert not eng.run(ASK, use_cache=True).unreported_stop
        verifier = Verifier(eng)
        verifier.run(STREAM)
    row = verifier.report.coverage["equivalence"]
    assert row == {"applied": 2, BOTH_STOPPED: 2}
    assert "equivalence" not in missing(verifier.report.coverage)  # shown, not a gap
    assert verifier.report.failures_by_check == {}


def test_waves_judge_an_unreported_stop_the_same_way() -> None:
    """The mlx-lm-1093 row's shape: a wave in which one request stops at once."""
    waves = (Wave((ASK, STOP, ASK)), Wave((STOP, ASK, STOP)))
    with engine("stop", "stop", concurrency=3) as eng:
        verifier = Verifier(eng)
        verifier.run_waves(waves)
    assert verifier.report.coverage["equivalence"] == {"applied": 3, BOTH_STOPPED: 3}
    assert "equivalence" not in missing(verifier.report.coverage)
    with (  # negative control: the cached side alone stops
        engine("stop", "answer", concurrency=3) as eng,
        pytest.raises(EquivalenceFailure, match="greedy tokens differ at new token 0"),
    ):
        Verifier(eng).run_waves(waves)


def test_the_cached_side_stopping_alone_fails_equivalence_at_token_0() -> None:
    with engine("stop", "answer") as eng, pytest.raises(EquivalenceFailure) as info:
        Verifier(eng).run(STREAM)
    text = str(info.value)
    assert "greedy tokens differ at new token 0: cached () vs uncached (" in text
    assert "the cached run stopped before its first token without reporting it" in text


def test_the_cold_side_stopping_alone_fails_equivalence_at_token_0() -> None:
    with engine("answer", "stop") as eng, pytest.raises(EquivalenceFailure) as info:
        Verifier(eng).run(STREAM)
    assert "uncached ()" in str(info.value)
    assert "the uncached run stopped before its first token" in str(info.value)


def test_tokens_reported_without_logprobs_are_still_a_fault() -> None:
    with engine("no-logprobs", "no-logprobs") as eng:
        with pytest.raises(EngineError, match="the reply has no logprobs"):
            eng.run(STOP, use_cache=True)
        with pytest.raises(EngineFault, match="the reply has no logprobs"):
            Verifier(eng).run(STREAM)


def test_an_unreported_stop_with_tokens_or_logprobs_is_a_fault() -> None:
    from pytest_prefixcache import Outcome
    from pytest_prefixcache.checks import fault_problems

    assert fault_problems(Outcome(unreported_stop=True), STOP) == []
    # negative controls: no first token and no stop, or a stop that reports a token after all
    assert [p.headline for p in fault_problems(Outcome(), STOP)] == [
        "the Outcome has neither logits nor top_logprobs"
    ]
    top = {i: -0.1 * (i + 1) for i in range(6)}
    bad = fault_problems(Outcome(unreported_stop=True, tokens=(5,), top_logprobs=top), STOP)
    assert [p.check for p in bad] == ["fault"]
    assert bad[0].headline.startswith("unreported_stop (no first token reported) but 1 new")
