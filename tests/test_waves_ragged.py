"""Every row at every step in the waves: ragged waves that decode, every decode step compared
and counted, and a failure that says whether batching or the cache is at fault.

Negative controls: a strategy bound (half of a wave decodes) is asserted on drawn waves and on
the minimal wave Hypothesis shrinks to; an engine that returns no decode-step logits leaves
the decode-step row uncompared; the same batch noise passes as a finding on an engine that
does not declare batch invariance and fails as a batching fault on one that does; a wrong
batch row with a clean cold wave is told as a cache fault.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from plugin_engines import FakeEngine

from pytest_prefixcache import EquivalenceFailure, Message, Outcome, Request, Verifier
from pytest_prefixcache.checks.coverage import APPLIED, coverage_lines
from pytest_prefixcache.html import render_html
from pytest_prefixcache.strategies import request_waves
from pytest_prefixcache.types import Wave
from pytest_prefixcache.verify.wave_judge import (
    BATCH_NOISE,
    BATCHING,
    CACHE_ONLY,
    DECODE_STEPS,
    DECODING,
    NO_STEPS,
    ONE_TOKEN,
)

LONG = "the same long prompt shared by every request of the wave, " * 2


def _req(text: str, new: int = 0) -> Request:
    return Request((Message("user", (text,)),), "", new)


#: Rows of different lengths, decoding different numbers of tokens, the second joining late.
RAGGED = (
    Wave((_req(LONG + "first", 4), _req(LONG + "second, a longer one to tell them apart", 2))),
    Wave((_req(LONG + "first", 3), _req(LONG + "second, a longer one", 0)), (0.0, 0.002)),
)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[*HealthCheck])
@given(waves=request_waves(max_size=6, max_images_per_message=0))
def test_at_least_half_of_every_wave_decodes(waves: tuple[Wave, ...]) -> None:
    for w in waves:
        counts = [r.max_new_tokens for r in w.requests]
        assert 2 * sum(n >= 2 for n in counts) >= len(counts), counts
        assert all(0 <= n <= 6 for n in counts), counts


def test_waves_shrink_to_two_requests_one_decoding_two_tokens() -> None:
    smallest = find(
        request_waves(max_images_per_message=0),
        lambda ws: True,
        settings=settings(database=None, max_examples=50),
    )
    assert len(smallest) == 1 and len(smallest[0]) == 2
    assert [r.max_new_tokens for r in smallest[0].requests] == [2, 0]


def test_ragged_waves_draw_different_lengths_and_late_joiners() -> None:
    """Over drawn waves: decode lengths differ within a wave, and staggered requests arrive
    after the first (they join while it decodes)."""
    seen = {"ragged": 0, "late": 0}

    @settings(max_examples=80, deadline=None, database=None, suppress_health_check=[*HealthCheck])
    @given(waves=request_waves(max_size=4, max_images_per_message=0))
    def draw(waves: tuple[Wave, ...]) -> None:
        for w in waves:
            lengths = {r.max_new_tokens for r in w.requests if r.max_new_tokens >= 2}
            seen["ragged"] += len(lengths) > 1
            seen["late"] += any(a > 0 for a in w.arrivals)

    draw()
    assert seen["ragged"] and seen["late"], seen


def test_every_decode_step_is_compared_and_counted() -> None:
    v = Verifier(FakeEngine(concurrent=4))
    v.run_waves(RAGGED)
    cov = v.report.coverage
    # request decode steps: 3 + 1 + 2 (the fourth request asks for no token)
    assert cov[DECODE_STEPS] == {APPLIED: 6}
    assert cov[DECODING] == {APPLIED: 3, ONE_TOKEN: 1}
    assert any(re.fullmatch(rf"\s*{DECODE_STEPS}\s+6/6", line) for line in coverage_lines(cov))


def test_the_decode_rows_reach_the_summary_the_json_and_the_html() -> None:
    v = Verifier(FakeEngine(concurrent=4))
    v.run_waves(RAGGED)
    report = v.report
    assert any(re.fullmatch(rf"\s*{DECODE_STEPS}\s+6/6", line) for line in report.lines())
    assert any(f"{DECODING}" in line and "3/4 (one token or none: 1)" in line
               for line in report.lines())  # fmt: skip
    assert report.to_json()["coverage"][DECODE_STEPS] == {APPLIED: 6}
    page = render_html(report)
    row = re.search(rf'data-check="{DECODE_STEPS}">(.*?)</tr>', page)
    assert row and '<td class="ran">6/6</td>' in row.group(1), page[-2000:]


def test_decode_steps_without_logits_are_counted_as_not_compared() -> None:
    """Negative control of the row: an engine that returns only the first step's logits."""

    class FirstOnly(FakeEngine):
        def run(self, request: Request, *, use_cache: bool) -> Outcome:
            out = super().run(request, use_cache=use_cache)
            return dataclasses.replace(out, step_logits=())

    v = Verifier(FirstOnly(concurrent=4))
    v.run_waves(RAGGED)
    assert v.report.coverage[DECODE_STEPS] == {APPLIED: 0, NO_STEPS: 6}


class Invariant(FakeEngine):
    """Declares that a reply never depends on the requests in flight with it."""

    batch_invariant = True


def test_batch_noise_on_a_batch_invariant_engine_is_a_batching_fault() -> None:
    with pytest.raises(EquivalenceFailure) as info:
        for _ in range(5):
            Verifier(Invariant(concurrent=4, batch_noise=True)).run_waves(RAGGED)
    msg = str(info.value)
    assert BATCHING in msg and "(cold in the wave vs cold alone)" in msg, msg
    assert "logits differ beyond the tolerance" in msg


def test_the_same_noise_without_the_declaration_is_a_finding() -> None:
    v = Verifier(FakeEngine(concurrent=4, batch_noise=True))
    for _ in range(5):
        v.run_waves(RAGGED)
    assert v.report.findings[BATCH_NOISE] >= 1


def test_a_wrong_batch_row_with_a_clean_cold_wave_is_a_cache_fault() -> None:
    waves = (
        Wave((_req(LONG + "first"), _req(LONG + "second, a longer one to tell them apart"))),
    ) * 2
    with pytest.raises(EquivalenceFailure) as info:
        v = Verifier(Invariant(concurrent=4, mix_rows=True))
        for _ in range(5):
            v.run_waves(waves)
    msg = str(info.value)
    assert f"{CACHE_ONLY}: logits differ" in msg and BATCHING not in msg, msg


def test_a_cached_step_after_the_first_token_is_compared() -> None:
    """A cached reply wrong only at its last decode step fails, and says which step."""

    class LateStep(Invariant):
        def run(self, request: Request, *, use_cache: bool) -> Outcome:
            out = super().run(request, use_cache=use_cache)
            if not use_cache or len(out.step_logits) < 3:
                return out
            steps = list(out.step_logits)
            steps[-1] = np.asarray(steps[-1], dtype=np.float32) + np.float32(0.5)
            return dataclasses.replace(out, step_logits=tuple(steps))

    with pytest.raises(EquivalenceFailure) as info:
        Verifier(LateStep(concurrent=4)).run_waves(RAGGED)
    msg = str(info.value)
    assert f"{CACHE_ONLY}: logits differ" in msg and "step 3 (before new token 3)" in msg, msg
