"""The prompt-logprobs check (#35 item 5): a hit's prompt logprobs at its reused positions must
be the cold run's. The pure check and its coverage row, the vLLM reply shape read by the HTTP
adapter, and the suite against the vLLM stub (tests/stub_openai.py) with the row in the
terminal, the JSON report and the HTML page; the negative control is the stub's
``corrupt_prompt`` fault (a hit's reused positions move by 1e-3)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from adapter_support import SYSTEM, req, user
from stub_openai import PAD

from pytest_prefixcache import EngineError, Outcome
from pytest_prefixcache.adapters.http.config import Readout
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.http.prompt_logprobs import read_prompt_logprobs
from pytest_prefixcache.adapters.presets import vllm_server
from pytest_prefixcache.checks import Tolerance, coverage_of
from pytest_prefixcache.checks.coverage import missing
from pytest_prefixcache.checks.prompt_logprobs import (
    NO_PROMPT_LOGPROBS,
    NO_REUSED_POSITION,
    PROMPT_LOGPROBS,
    prompt_logprob_problems,
)
from pytest_prefixcache.output.report import Report
from pytest_prefixcache.traits import traits_of

pytest_plugins = ["pytester"]

STUB = Path(__file__).resolve().parent / "stub_openai.py"
TEXT = req(SYSTEM, user("Hello there, how are you today? Tell me a story about cats. " * 2))
PROMPT = (None, {5: -0.5, 7: -1.0}, {3: -0.25, 9: -2.0}, {4: -0.1})


def outcome(prompt: object = PROMPT, cached: int = 2) -> Outcome:
    return Outcome(tokens=(1,), cached_tokens=cached, prompt_logprobs=prompt)  # type: ignore[arg-type]


def moved(at: int, by: float) -> tuple[dict[int, float] | None, ...]:
    return tuple(
        None if p is None else {t: v + (by if i == at else 0.0) for t, v in p.items()}
        for i, p in enumerate(PROMPT)
    )


def test_equal_prompt_logprobs_pass_and_a_moved_reused_position_fails() -> None:
    assert prompt_logprob_problems(outcome(), outcome(cached=0), Tolerance()) == []
    (p,) = prompt_logprob_problems(outcome(moved(1, 1e-3)), outcome(cached=0), Tolerance())
    assert p.check == PROMPT_LOGPROBS and p.position == 1
    assert p.headline.startswith("differ at position 1 (reused: cached_tokens=2)")
    assert p.details[0].startswith("2 value(s) differ beyond exact, 2 of them at reused")
    # a computed position is compared too, and named as computed
    (p,) = prompt_logprob_problems(outcome(moved(3, 0.5)), outcome(cached=0), Tolerance())
    assert "position 3 (computed" in p.headline and "|diff| 0.5" in p.details[1]
    # within the tolerance: no problem; a shorter list: a problem naming both lengths
    assert prompt_logprob_problems(outcome(moved(1, 1e-3)), outcome(), Tolerance(atol=1e-2)) == []
    (p,) = prompt_logprob_problems(outcome(PROMPT[:3]), outcome(), Tolerance())
    assert "3 positions cached vs 4 uncached" in p.headline


def test_the_coverage_row() -> None:
    def row(cached: Outcome, uncached: Outcome, declared: bool = False) -> str | None:
        got = dict(coverage_of(TEXT, cached, uncached, has_usage=False, prompt_logprobs=declared))
        return got.get(PROMPT_LOGPROBS)

    none = Outcome(tokens=(1,), cached_tokens=2)
    assert row(none, none) is None  # neither returned them, none declared: no row
    assert row(outcome(), outcome()) == "applied"
    assert row(outcome(cached=0), outcome()) == NO_REUSED_POSITION
    assert row(none, none, declared=True) == row(outcome(), none) == NO_PROMPT_LOGPROBS
    report = Report(requests=2)
    report.count(PROMPT_LOGPROBS, NO_REUSED_POSITION)
    assert missing(report.coverage) == {}  # nothing reused is not a gap
    report.count(PROMPT_LOGPROBS, NO_PROMPT_LOGPROBS)
    assert missing(report.coverage) == {PROMPT_LOGPROBS: {NO_PROMPT_LOGPROBS: 1}}


def test_the_vllm_reply_shape_is_read_and_a_wrong_one_named() -> None:
    reply = {"choices": [{}], "prompt_logprobs": [None, {"5": {"logprob": -0.5, "rank": 1}}]}
    assert read_prompt_logprobs(reply) == (None, {5: -0.5})
    assert read_prompt_logprobs({"choices": [{}]}) is None
    with pytest.raises(EngineError, match="prompt_logprobs position 1"):
        read_prompt_logprobs({"prompt_logprobs": [None, {"x": {"logprob": 1}}]})
    with pytest.raises(EngineError, match="prompt_logprobs=-1 is not an int >= 0"):
        Readout(prompt_logprobs=-1)


@pytest.fixture
def stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIEngine]:
    monkeypatch.delenv("STUB_FAULT", raising=False)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 264, "image_token_id": PAD}))
    python = f"{sys.executable} {STUB} --flavour vllm"
    engine = vllm_server(tmp_path, python=python, start_timeout=60, prompt_logprobs=3)
    yield engine
    engine.close()


def test_the_preset_asks_for_prompt_logprobs_and_a_hit_matches_the_cold_run(
    stub: OpenAIEngine,
) -> None:
    assert traits_of(stub).returns_prompt_logprobs
    stub.run(TEXT, use_cache=True)
    hit, cold = stub.run(TEXT, use_cache=True), stub.run(TEXT, use_cache=False)
    assert hit.cached_tokens and hit.cached_tokens >= 32 and cold.cached_tokens == 0
    assert hit.prompt_logprobs is not None and len(hit.prompt_logprobs) == hit.prompt_tokens
    assert hit.prompt_logprobs[0] is None and all(
        len(p or {}) >= 3 for p in hit.prompt_logprobs[1:]
    )
    assert prompt_logprob_problems(hit, cold, Tolerance()) == []


def test_a_hit_whose_reused_prompt_logprobs_moved_fails(
    stub: OpenAIEngine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STUB_FAULT", "corrupt_prompt")
    python = f"{sys.executable} {STUB} --flavour vllm"
    with vllm_server(tmp_path, python=python, start_timeout=60, prompt_logprobs=3) as bad:
        bad.run(TEXT, use_cache=True)
        hit, cold = bad.run(TEXT, use_cache=True), bad.run(TEXT, use_cache=False)
    (p,) = prompt_logprob_problems(hit, cold, Tolerance())
    assert p.headline.startswith("differ at position 1 (reused: cached_tokens=")


ENGINES = """
import json, pathlib, sys
from pytest_prefixcache.adapters.presets import vllm_server

HERE = pathlib.Path(__file__).parent
(HERE / "config.json").write_text(json.dumps({"vocab_size": 264, "image_token_id": 262}))


def vllm():
    python = f"{sys.executable} STUB --flavour vllm"
    return vllm_server(HERE, python=python, start_timeout=60, audit=False, prompt_logprobs=3)
"""


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["", "corrupt_prompt"])
def test_the_suite_shows_the_row_and_fails_a_corrupted_hit(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    monkeypatch.setenv("STUB_FAULT", fault)
    pytester.makepyfile(stubengines=ENGINES.replace("STUB", str(STUB)))
    report, page = pytester.path / "report.json", pytester.path / "report.html"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-engine=stubengines:vllm",
        "--prefixcache-examples=3", "--prefixcache-seed=1", "--prefixcache-allow-partial",
        "-k", "request_streams", f"--prefixcache-report={report}", f"--prefixcache-html={page}",
        timeout=300,
    )  # fmt: skip
    coverage = json.loads(report.read_text())["coverage"][PROMPT_LOGPROBS]
    assert coverage.get("applied", 0) > 0, coverage
    assert PROMPT_LOGPROBS in page.read_text()
    if not fault:
        result.stdout.fnmatch_lines(["failures by check: none", "  prompt logprobs * [1-9]*/*"])
        assert result.ret == 0
    else:
        result.stdout.fnmatch_lines(
            [
                "*PromptLogprobsFailure: prompt logprobs: differ at position *",
                "*failures by check: prompt logprobs*",
            ]
        )
        assert result.ret == 1
