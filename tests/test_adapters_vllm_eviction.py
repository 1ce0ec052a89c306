"""The vLLM preset on a KV cache smaller than a stream's working set (the vLLM stub with
``--num-gpu-blocks-override``, tests/stub_openai.py): evicted blocks cost reuse, never the
verdict; the salted cold runs share the capacity and evict too. A stub that keeps serving an
evicted block's hash from the slot that overwrote it (a wrong answer after eviction) fails
equivalence: the negative control."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pytest
from adapter_support import SYSTEM, assistant, req, user
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hseed
from stub_openai import PAD

from pytest_prefixcache import EquivalenceFailure, PositiveControlFailure, Request, Verifier
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.vllm import vllm_matrix_engine, vllm_server
from pytest_prefixcache.checks import CAPACITY, OLDER_ENTRY
from pytest_prefixcache.strategies import request_streams
from pytest_prefixcache.traits import traits_of
from pytest_prefixcache.types import Wave

STUB = Path(__file__).resolve().parent / "stub_openai.py"
PYTHON = f"{sys.executable} {STUB} --flavour vllm"


def topic(word: str) -> Request:
    """A one-turn request of about 200 prompt tokens (the stub's tokens are bytes)."""
    return req(SYSTEM, user(" ".join(f"{word} {i}" for i in range(18))))


A, B, C = topic("apples"), topic("bears"), topic("clouds")
NEXT = req(*A.messages, assistant("Crisp."), user("And pears?"))
#: A, a repeat (a full hit), two fillers that share only the system prompt with A, then A
#: and its next turn: with 11 blocks of 32 the fillers' blocks (and every salted cold run's)
#: evict A's.
STREAM = (A, A, B, C, A, NEXT)


def engine(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    blocks: int | None,
    fault: str = "",
    *more: str,
) -> OpenAIEngine:
    """The vLLM stub through the matrix factory (claims on), ``blocks`` as the override."""
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 264, "image_token_id": PAD}))
    monkeypatch.setenv("STUB_FAULT", fault)
    flags = [*([] if blocks is None else [f"--num-gpu-blocks-override {blocks}"]), *more]
    return vllm_matrix_engine(str(tmp_path), flags, python=PYTHON)


def evictions(e: OpenAIEngine) -> float:
    url = getattr(e.server, "url", e.server)
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        text = r.read().decode()
    line = next(x for x in text.splitlines() if x.startswith("vllm:kv_block_idle_before_evict"))
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.parametrize("blocks", [None, 12], ids=["room", "evicting"])
def test_lost_reuse_to_eviction_is_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blocks: int | None
) -> None:
    """With room, A's third run reuses every whole block; with 11 blocks it reuses less (the
    fillers and the salted cold runs evicted A's blocks), every check still passes, the claim
    sources still agree, and the report's efficiency shows the loss."""
    with engine(tmp_path, monkeypatch, blocks) as e:
        verifier = Verifier(e)
        steps = verifier.run(STREAM)
        lost = evictions(e)
    third = steps[4]
    assert third.match is not None and third.cached.cached_tokens is not None
    report = verifier.report
    assert report.failures == [] and report.claims_checked == 0  # no tap: sources agree
    if blocks is None:
        assert lost == 0 and third.cached.cached_tokens == third.match.allowed
        assert report.efficiency == 1.0
    else:
        assert lost > 0 and third.cached.cached_tokens < third.match.allowed
        assert report.efficiency is not None and report.efficiency < 1.0
        # even the repeat lost blocks: request 0's salted cold run took them
        repeat = steps[1]
        assert repeat.match is not None
        assert 0 < (repeat.cached.cached_tokens or 0) < repeat.match.allowed


def test_a_block_served_after_it_was_overwritten_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: the same stream on a stub whose evicted hashes stay indexed, so
    a hit reads the tokens of the block that took the slot: equivalence fails."""
    with engine(tmp_path, monkeypatch, 12, "stale_after_evict") as e:
        with pytest.raises(EquivalenceFailure, match="differ"):
            Verifier(e).run(STREAM)


def test_generated_streams_on_a_small_cache_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generated streams (text and images) on 23 blocks: the stub evicts, nothing fails. A
    next turn whose reusable prefix only an older request left (the stub renders text-only
    and image prompts differently) is the ``older entry`` finding: those blocks were evicted
    (before that finding, this run failed the positive control)."""
    with engine(tmp_path, monkeypatch, 24) as e:
        verifier = Verifier(e)

        @hseed(3)
        @settings(max_examples=15, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(request_streams())
        def streams(stream: tuple[Request, ...]) -> None:
            verifier.run(stream)

        streams()
        lost = evictions(e)
    report = verifier.report
    assert lost > 0 and report.failures == [] and report.cache_hits > 0
    assert report.findings.get(OLDER_ENTRY, 0) >= 1, report.findings


@pytest.mark.parametrize("fault", ["", "stale_after_evict"], ids=["honest", "stale"])
def test_waves_on_a_small_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """Waves of three in flight on 11 blocks (the matrix's waves configurations: claims
    off): the honest stub evicts and passes; the stale one answers a wave's hit from an
    overwritten block and fails equivalence (the negative control)."""
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 264, "image_token_id": PAD}))
    monkeypatch.setenv("STUB_FAULT", fault)
    flags = ["--num-gpu-blocks-override 12", "--max-num-seqs 2"]
    waves = (Wave((A, B, C)), Wave((A, NEXT, B)), Wave((C, A, NEXT)))
    with vllm_matrix_engine(str(tmp_path), flags, concurrency=4, claims=False, python=PYTHON) as e:
        verifier = Verifier(e)
        if fault:
            with pytest.raises(EquivalenceFailure, match=r"wave \d, cache: .*: logits differ"):
                verifier.run_waves(waves)
            return
        verifier.run_waves(waves)
        assert evictions(e) > 0 and verifier.report.cache_hits >= 1


@pytest.mark.parametrize("blocks", [8, 21], ids=["filled", "room"])
def test_a_repeat_of_a_request_that_fills_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blocks: int
) -> None:
    """On 7 blocks a request of 249 tokens (7 full blocks) and its salted cold run do not both
    fit: the cold run evicts the whole prefix, the repeat reuses 0, and the control's finding is
    ``cache capacity`` (vLLM did the same on 11 blocks: 0 of 288). With room for both, the
    repeat reuses; and a stub that never stores still fails the control (negative control)."""
    with engine(tmp_path, monkeypatch, blocks) as e:
        assert e.cache_capacity_tokens == (blocks - 1) * 32  # type: ignore[attr-defined]
        verifier = Verifier(e)
        steps = verifier.run([A, A])
    if blocks == 8:
        assert steps[1].cached.cached_tokens == 0
        assert verifier.report.findings == {CAPACITY: 1}
    else:
        assert (steps[1].cached.cached_tokens or 0) > 0 and verifier.report.findings == {}
        never = engine(tmp_path, monkeypatch, blocks, "", "--no-cache-prompt")
        with never, pytest.raises(PositiveControlFailure, match="nothing stored"):
            Verifier(never).run([A, A])


def test_the_capacity_is_declared_for_the_salted_baseline_only(tmp_path: Path) -> None:
    """The cold runs of ``cold="reset"`` go to a server of their own: no shared capacity."""
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 264, "image_token_id": PAD}))
    flags = ["--num-gpu-blocks-override 13", "--block-size 64"]
    with vllm_server(tmp_path, python=PYTHON, flags=flags) as salted:
        assert salted.cache_capacity_tokens == 12 * 64  # type: ignore[attr-defined]
    with vllm_server(tmp_path, python=PYTHON, flags=flags, cold="reset") as apart:
        assert traits_of(apart).cache_capacity_tokens is None
    with vllm_server(tmp_path, python=PYTHON) as unbounded:
        assert traits_of(unbounded).cache_capacity_tokens is None
