"""The HTTP adapter sends waves when the server is declared concurrent: against the vLLM-like
stub (a correct one passes, one that corrupts hits fails) and the reference server."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from stub_openai import PAD, serve, url_of

from pytest_prefixcache import EngineError, EquivalenceFailure, Message, Request, Verifier
from pytest_prefixcache.adapters import presets
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.presets import VLLM_RESETS
from pytest_prefixcache.types import Wave
from pytest_prefixcache.verify.concurrent import CONCURRENT, NO_ORDER

SYSTEM = "You are a careful assistant. Answer every question precisely and briefly. " * 2


def _req(text: str, new: int = 2) -> Request:
    return Request((Message("system", (SYSTEM,)), Message("user", (text,))), "", new)


WAVES = (
    Wave((_req("first question"), _req("second question"), _req("first question"))),
    Wave((_req("first question"), _req("third one"), _req("second question")), (0, 0.005, 0.01)),
)


def _stub_engine(fault: str = "") -> tuple[Any, OpenAIEngine, list[int]]:
    srv = serve("vllm", fault)
    stub = srv.stub  # type: ignore[attr-defined]
    complete, lock, flight = stub.complete, threading.Lock(), [0, 0]

    def counted(body: dict[str, Any]) -> dict[str, Any]:
        with lock:
            flight[0] += 1
            flight[1] = max(flight)
        try:
            time.sleep(0.02)  # a batch: the requests of a wave overlap
            return complete(body)
        finally:
            with lock:
                flight[0] -= 1

    stub.complete = counted
    engine = OpenAIEngine(
        url=url_of(srv),
        cold="salt",
        namespace_field="cache_salt",
        reset_paths=VLLM_RESETS,
        extra_body={"return_tokens_as_token_ids": True},
        prompt_ids="reply",
        image_token_id=PAD,
        concurrency=3,
    )
    return srv, engine, flight


def test_a_concurrent_server_gets_its_waves_in_flight_together() -> None:
    srv, engine, flight = _stub_engine()
    try:
        assert engine.max_concurrency == 3
        verifier = Verifier(engine)
        verifier.run_waves(WAVES)
        assert flight[1] >= 2, "the wave's requests were never in flight together"
        assert verifier.report.coverage[CONCURRENT] == {NO_ORDER: 6}  # vLLM says no order
        assert verifier.report.cache_hits >= 1
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_server_that_corrupts_hits_fails_the_waves() -> None:
    srv, engine, _ = _stub_engine("corrupt")
    try:
        with pytest.raises(EquivalenceFailure, match=r"wave \d, cache: .*: logits differ"):
            Verifier(engine).run_waves(WAVES)
    finally:
        srv.shutdown()
        srv.server_close()


def test_concurrency_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EngineError, match="concurrency=0 is not an int >= 1"):
        OpenAIEngine(url="http://127.0.0.1:9", cold="salt", namespace_field="s", concurrency=0)
    monkeypatch.setenv("PREFIXCACHE_SERVER_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("PREFIXCACHE_COLD", "salt")
    monkeypatch.setenv("PREFIXCACHE_NAMESPACE_FIELD", "cache_salt")
    monkeypatch.setenv("PREFIXCACHE_CONCURRENCY", "many")
    with pytest.raises(EngineError, match="PREFIXCACHE_CONCURRENCY='many' is not an integer >= 1"):
        presets.from_env()
    monkeypatch.setenv("PREFIXCACHE_CONCURRENCY", "4")
    assert presets.from_env().max_concurrency == 4


@pytest.mark.slow
def test_the_reference_server_serves_waves_in_its_own_order() -> None:
    pytest.importorskip("mlx_vlm")
    engine = presets.reference_server(concurrency=4)
    try:
        verifier = Verifier(engine)
        steps = verifier.run_waves(WAVES)
        assert verifier.report.coverage[CONCURRENT] == {"applied": 6}
        assert verifier.report.worst_diff == 0.0
        assert len({s.cached.served for s in steps}) == 6
    finally:
        engine.close()
