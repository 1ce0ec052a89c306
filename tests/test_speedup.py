"""``--prefixcache-min-speedup`` is judged on what reuse saves: the time to first token
(``Outcome.first_token_seconds``), not on whole calls, whose decode costs the same warm and
cold; whole calls only when a hit's run reports no time to first token, and then it says so.

The figures the verdict rests on are sleeps of a fake engine, far from the floor, so the
verdicts do not depend on the machine's load; the reference engine's own figure is checked
for what it counts (the prefill, not the decode)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from pytest_prefixcache import Message, Outcome, Request
from pytest_prefixcache.checks import FIRST_TOKEN, WHOLE_CALLS, speedup_problem
from pytest_prefixcache.errors import SpeedupFailure
from pytest_prefixcache.output.report import Report
from pytest_prefixcache.verify.efficiency import StreamEfficiency
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions

#: The fake's prefill: seconds per computed prompt token; its decode: seconds per new token.
PREFILL_S = 0.002
DECODE_S = 0.012
FLOOR = 2.0


def _hit(warm_first: float | None, cold_first: float | None) -> tuple[Outcome, Outcome]:
    return (
        Outcome(cached_tokens=40, first_token_seconds=warm_first),
        Outcome(cached_tokens=0, first_token_seconds=cold_first),
    )


def test_a_decode_heavy_stream_is_judged_on_its_time_to_first_token() -> None:
    report, eff = Report(), StreamEfficiency()
    for _ in range(2):  # whole calls: decode 1 s, the same warm and cold; prefill 0.3 s saved
        cached, uncached = _hit(0.05, 0.35)
        eff.add_times(report, cached, uncached, 1.06, 1.35, "")
    measure, warm, cold = eff.speedup_times()
    assert (measure, round(warm, 6), round(cold, 6)) == (FIRST_TOKEN, 0.1, 0.7)
    assert speedup_problem(warm, cold, FLOOR, measure) is None
    # negative control: the same stream judged on whole calls fails a correct cache
    problem = speedup_problem(eff.warm, eff.cold, FLOOR, WHOLE_CALLS)
    assert problem is not None and "speedup 1.27x" in problem.headline


def test_a_hit_without_time_to_first_token_falls_back_to_whole_calls_and_says_so() -> None:
    report, eff = Report(), StreamEfficiency()
    eff.add_times(report, *_hit(0.05, 0.35), 1.06, 1.35, "")
    eff.add_times(report, *_hit(0.05, None), 1.06, 1.35, "")  # the cold run did not say
    measure, warm, cold = eff.speedup_times()
    assert (measure, round(warm, 6), round(cold, 6)) == (WHOLE_CALLS, 2.12, 2.7)
    problem = speedup_problem(warm, cold, FLOOR, measure)
    assert problem is not None
    assert problem.details[0] == f"measured on: {WHOLE_CALLS}"
    assert any("Outcome.first_token_seconds" in d for d in problem.details)
    assert report.untimed_hits == 1 and report.speedup_measure == WHOLE_CALLS
    line = next(line for line in report.lines() if line.startswith("time on cache hits"))
    assert line == (
        "time on cache hits (whole calls, 1 hit(s) reporting no time to first token): "
        "2.12 s warm vs 2.70 s cold (speedup 1.27x)"
    )


def test_the_reports_name_the_measure_and_keep_both_figures(tmp_path: Path) -> None:
    report = Report(requests=4, cache_hits=2, warm_seconds=2.0, cold_seconds=2.5)
    report.warm_first_token, report.cold_first_token = 0.1, 0.4
    assert (
        "time to first token on cache hits: 0.10 s warm vs 0.40 s cold (speedup 4.00x); "
        "whole calls: 2.00 s warm vs 2.50 s cold (speedup 1.25x)"
    ) in report.lines()
    report.write_json(tmp_path / "report.json")
    back = Report.read_json(tmp_path / "report.json")
    assert back.to_json()["speedup_measure"] == FIRST_TOKEN
    assert (back.warm_first_token, back.cold_first_token) == (0.1, 0.4)
    merged = Report()
    merged.merge(back, "gw0")
    merged.merge(back, "gw1")
    assert (merged.warm_first_token, merged.cold_first_token) == (0.2, 0.8)


class TimedEngine:
    """A prefix cache whose prefill sleeps ``PREFILL_S`` per computed token and whose decode
    sleeps ``DECODE_S`` per new token, reporting its time to first token (unless
    ``reports_first_token`` is False). ``reuses`` False: it claims the hit but computes the
    whole prompt again (a cache that saves nothing)."""

    def __init__(self, *, reuses: bool = True, reports_first_token: bool = True) -> None:
        self.reuses = reuses
        self.reports_first_token = reports_first_token
        self.stored: set[tuple[int, ...]] = set()

    def reset(self) -> None:
        self.stored.clear()

    def run(self, request: Request, *, use_cache: bool) -> Outcome:
        start = time.perf_counter()
        text = "".join(str(p) for m in request.messages for p in m.content)
        ids = tuple(ord(c) for c in text)
        cached = 0
        if use_cache:
            cached = max((len(p) for p in self.stored if ids[: len(p)] == p), default=0)
            cached = min(cached, len(ids) - 1)
            self.stored.add(ids)
        time.sleep((len(ids) - (cached if self.reuses else 0)) * PREFILL_S)
        first = time.perf_counter() - start
        time.sleep(request.max_new_tokens * DECODE_S)
        logits = np.random.default_rng(len(ids)).standard_normal(16).astype(np.float32)
        return Outcome(
            logits=logits,
            cached_tokens=cached,
            prompt_tokens=len(ids),
            first_token_seconds=first if self.reports_first_token else None,
        )


def _stream() -> list[Request]:
    head = "describe the following scene in detail please " * 2
    return [
        Request((Message("user", (head,)),), max_new_tokens=24),
        Request((Message("user", (head + "and then more",)),), max_new_tokens=24),
    ]


def _verify(engine: TimedEngine, tmp_path: Path) -> Verifier:
    options = VerifyOptions(failures_dir=tmp_path, min_speedup=FLOOR)
    verifier = Verifier(engine, options=options)  # type: ignore[arg-type]
    verifier.run(_stream())
    return verifier


@pytest.mark.timing
def test_a_correct_cache_passes_on_decode_heavy_streams(tmp_path: Path) -> None:
    verifier = _verify(TimedEngine(), tmp_path)
    report = verifier.report
    assert report.speedup_measure == FIRST_TOKEN
    assert report.cold_first_token / report.warm_first_token >= FLOOR
    # negative control: the same cache judged on whole calls (it reports no first token)
    with pytest.raises(SpeedupFailure) as info:
        _verify(TimedEngine(reports_first_token=False), tmp_path)
    assert f"measured on: {WHOLE_CALLS}" in str(info.value)


@pytest.mark.timing
def test_a_cache_that_reuses_nothing_still_fails_on_time_to_first_token(tmp_path: Path) -> None:
    with pytest.raises(SpeedupFailure) as info:
        _verify(TimedEngine(reuses=False), tmp_path)
    message = str(info.value)
    assert f"below --prefixcache-min-speedup={FLOOR:g}" in message
    assert f"measured on: {FIRST_TOKEN}" in message


def test_the_reference_engine_counts_its_prefill_not_its_decode(model: object) -> None:
    pytest.importorskip("mlx.core")
    from reference_engine import Engine

    pause = 0.3

    class SlowDecode(Engine):
        def decode(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
            time.sleep(pause)
            return super().decode(*args, **kwargs)  # type: ignore[arg-type]

    engine = SlowDecode(model)  # type: ignore[arg-type]
    request = Request((Message("user", ("What colour is the sky?",)),), max_new_tokens=3)
    for use_cache in (True, False):
        start = time.perf_counter()
        out = engine.run(request, use_cache=use_cache)
        wall = time.perf_counter() - start
        assert out.first_token_seconds is not None and out.first_token_seconds > 0
        assert wall - out.first_token_seconds >= pause  # the decode's pause is not counted


def test_servers_carry_their_time_to_first_token_to_the_outcome() -> None:
    from pytest_prefixcache.adapters.http.replies import parse_reply, with_extension
    from reference_engine.openai_api.replies import extension

    reply = {"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 9}}
    assert parse_reply(reply).prompt_seconds is None  # control: nothing reported
    reply["timings"] = {"prompt_ms": 12.5, "cache_n": 4}  # llama-server's
    assert parse_reply(reply).prompt_seconds == 0.0125
    ext = extension(Outcome(first_token_seconds=0.25, token_ids=(1, 2)), logits=False)
    assert with_extension(Outcome(), {"prefixcache": ext}, 0).first_token_seconds == 0.25
    ext = extension(Outcome(token_ids=(1, 2)), logits=False)  # control: not reported
    assert "first_token_seconds" not in ext
    assert with_extension(Outcome(), {"prefixcache": ext}, 0).first_token_seconds is None


def test_the_replays_keep_each_hits_fastest_runs() -> None:
    from pytest_prefixcache.verify.efficiency import FastestRuns

    fastest = FastestRuns()
    for warm_first in (0.09, 0.01, 0.02):  # a replay preempted during its warm run
        cached, uncached = _hit(warm_first, 0.03)
        fastest.add(1, cached, uncached, 1.0, 1.0)
        fastest.add(0, Outcome(cached_tokens=0), uncached, 9.0, 0.1)  # no hit: not counted
    assert fastest.speedup(FIRST_TOKEN) == pytest.approx(3.0)
    assert fastest.speedup(WHOLE_CALLS) == pytest.approx(1.0)
    slow = FastestRuns()  # control: a cache slower on every replay stays slow
    for warm_first in (0.09, 0.05, 0.06):
        slow.add(1, *_hit(warm_first, 0.03), 1.0, 1.0)
    assert slow.speedup(FIRST_TOKEN) == pytest.approx(0.6)
