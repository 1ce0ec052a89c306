"""A request count that rests on inferred rows is confirmed one request at a time before it may
fail (DESIGN.md, rule 5; verify/confirm.py ``confirm_count``).

The tap counts a server's prefills as the tracks of its ledger. Where the scheduler labels its
rows, a track is a request; for an unknown server under concurrency a track is inferred, and
a wrong inference reads exactly like a prefill too many: mlx_lm.server 0.31.2 on
tiny-gemma3-text, rows unlabelled (PREFIXCACHE_TAP_IDENTITY=0), failed "answered 70 request(s)
but its model ran 71 prefill(s)" on the tap's first fit alone (engines/history/bugs.toml, the
mlx-lm-1141-batch-extend-dimension-gemma3 row). The ledger now says when a mismatch counts
inferred tracks of interleaved requests (``INFERRED_COUNT``); the wave is then replayed one
request at a time on an emptied cache, and only a count that is wrong again fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from plugin_engines import FakeEngine
from test_tap_tracks import ledger, row
from test_waves import TWO_WAVES

from pytest_prefixcache import PrefixCacheError, Verifier
from pytest_prefixcache.output.report import INCONCLUSIVE
from pytest_prefixcache.tap.tracks import INFERRED_COUNT

TOO_MANY = "http://127.0.0.1:1 answered 2 request(s) but its model ran 3 prefill(s)"


class Counting:
    """A correct concurrent engine whose tap count says ``said`` after its first wave, then
    ``after`` (what the sequential replay shows)."""

    def __init__(self, said: str, after: list[str]) -> None:
        self.inner = FakeEngine(concurrent=4)
        self.max_concurrency = 4
        self.said, self.after, self.calls, self.resets = said, after, 0, 0

    def run(self, request: Any, *, use_cache: bool) -> Any:
        return self.inner.run(request, use_cache=use_cache)

    def reset(self) -> None:
        self.resets += self.calls > 0  # a reset after the count: the sequential replay's
        self.inner.reset()

    def request_count_problems(self) -> list[str]:
        self.calls += 1
        return [self.said] if self.calls == 1 else list(self.after)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


INFERRED = f"{TOO_MANY} (the logit tap's count; 1 of them {INFERRED_COUNT}, no scheduler label)"


def test_an_inferred_count_that_fits_one_request_at_a_time_is_inconclusive() -> None:
    engine = Counting(INFERRED, [])
    v = Verifier(engine)  # type: ignore[arg-type]
    v.run_waves(TWO_WAVES)
    assert engine.resets == 1 and v.report.findings[INCONCLUSIVE] == 1
    assert any("counts one prefill per request" in f for f in v.report.finding_examples)
    assert v.report.verdict == "inconclusive"


def test_an_inferred_count_that_is_wrong_again_fails_saying_so() -> None:
    engine = Counting(INFERRED, [f"{TOO_MANY} since the last mismatch reported"])
    with pytest.raises(PrefixCacheError, match="request count") as info:
        Verifier(engine).run_waves(TWO_WAVES)  # type: ignore[arg-type]
    assert "confirmed one request at a time" in str(info.value)


def test_a_count_by_the_schedulers_labels_fails_without_a_replay() -> None:
    # the negative control: the same mismatch, counted by labels, fails at once
    engine = Counting(f"{TOO_MANY} (the logit tap's count)", [])
    with pytest.raises(PrefixCacheError, match="request count") as info:
        Verifier(engine).run_waves(TWO_WAVES)  # type: ignore[arg-type]
    assert engine.resets == 0 and "one request at a time" not in str(info.value)


def test_the_ledger_says_when_a_mismatch_counts_inferred_tracks(tmp_path: Path) -> None:
    # two requests in flight together, unlabelled; a third track appears (a prefill too many)
    calls = [
        ("p", [row(0, 4, [1, 2, 3, 4], 2), row(0, 4, [1, 5, 6, 7], 6)]),
        ("q", [row(0, 4, [1, 5, 6, 7], 6)]),
    ]
    led = ledger(tmp_path, calls)
    led.count_sent()
    led.count_sent()
    assert INFERRED_COUNT in led.count_problem()
    # the same with one request at a time: a count, not a guess
    (tmp_path / "alone").mkdir()
    alone = ledger(tmp_path / "alone", [("p", [row(0, 4, [1, 2, 3, 4], 2)]), calls[1]])
    alone.count_sent()
    problem = alone.count_problem()
    assert "ran 2 prefill(s)" in problem and INFERRED_COUNT not in problem
