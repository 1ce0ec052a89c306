"""A server's own warm-up as an earlier request (issue #33, rapid-mlx #1732/#1863 rows):
rapid-mlx 0.12 sends 'Hi' through its prefix cache at start, so the first stream request may
validly reuse the chat template's opening it shares with that warm-up. The tap sees the
warm-up's prefill before the first request (:meth:`TapLedger.started`); the HTTP adapter hands
its ids to the verifier (``warmup_prompts``), which adds them to the token oracle."""

from __future__ import annotations

import json
from pathlib import Path

from test_tap_tracks import ledger, row

from pytest_prefixcache.checks.oracle import WARMUP, ReuseOracle
from pytest_prefixcache.checks.reuse import reuse_problems
from pytest_prefixcache.types import Outcome

WARM = [1, 2, 3, 4, 5, 6, 7]  # the template's opening (5 tokens), 'Hi', the assistant's turn
FIRST = [1, 2, 3, 4, 5, 9, 9, 9, 9, 7]  # the first request: shares 5 tokens with WARM


def test_the_warmup_makes_its_shared_prefix_valid_reuse() -> None:
    oracle = ReuseOracle()
    oracle.add_warmup([WARM])
    match = oracle.match("", FIRST, ())
    assert (match.max_reuse, match.source) == (5, WARMUP)
    assert reuse_problems(Outcome(cached_tokens=5), match) == []
    assert "at the server's own warm-up prompt" in match.references()
    # more than the warm-up shares is still an over-claim, and says where the 5 came from
    (problem,) = reuse_problems(Outcome(cached_tokens=6), match)
    assert "the server's own warm-up prompt" in " ".join((problem.headline, *problem.details))
    # negative control: without the warm-up the same 5 tokens are an over-claim of 5
    bare = ReuseOracle().match("", FIRST, ())
    assert bare.max_reuse == 0 and reuse_problems(Outcome(cached_tokens=5), bare)
    assert ReuseOracle().match("ns", FIRST, ()).max_reuse == 0  # another namespace's cache


def test_the_ledger_hands_over_the_prefills_of_the_latest_start(tmp_path: Path) -> None:
    warm = [("w", [row(0, 7, WARM, 2)]), ("w", [row(7, 8, [2], 2)])]  # prefill, one step
    led = ledger(tmp_path, warm)
    led.started()
    assert led.warmup == 1 and led.warmup_prompts() == [tuple(WARM)]
    # a request answered after the start is no warm-up (negative control)
    with (tmp_path / "tap.jsonl").open("a") as f:
        rec = {"seq": 9, "cls": "M", "n": 10, "batch": 1, "offset": 0, "pid": 1}
        f.write(json.dumps({**rec, "cache": "1:q", "rows": [row(5, 10, FIRST[5:], 3)]}) + "\n")
    led.count_sent()
    led.refresh()
    assert led.warmup_prompts() == [tuple(WARM)]
    led.started()  # a restart that ran no warm-up this time: nothing of the last one stays
    assert led.warmup_prompts() == [] and led.warmup == 1


def test_a_warmup_whose_ids_the_tap_could_not_read_is_left_out(tmp_path: Path) -> None:
    led = ledger(tmp_path, [])
    r = {**row(0, 7, WARM, 2), "ids": None}  # embeddings: no ids
    with (tmp_path / "tap.jsonl").open("a") as f:
        rec = {"seq": 0, "cls": "M", "n": 7, "batch": 1, "offset": 0, "pid": 1}
        f.write(json.dumps({**rec, "cache": "1:w", "rows": [r]}) + "\n")
    led.started()
    assert led.warmup == 1 and led.warmup_prompts() == []


class _Server:
    """An engine stand-in: only what ``Verifier.reset`` calls."""

    def __init__(self, warm: list[tuple[int, ...]] | None) -> None:
        if warm is not None:
            self.warmup_prompts = lambda: warm

    def reset(self) -> None:
        pass

    def run(self, request: object, use_cache: bool = True) -> Outcome:
        raise AssertionError("not called")


def test_each_reset_gives_the_oracle_the_servers_warmup() -> None:
    from pytest_prefixcache.verify.verifier import Verifier

    verifier = Verifier(_Server([tuple(WARM)]))
    verifier.reset()
    assert verifier.oracle.match("", FIRST, ()).max_reuse == 5
    verifier.reset()  # once per reset, not piling up (the oracle is emptied first)
    assert len(verifier.oracle._history[""]) == 1
    plain = Verifier(_Server(None))  # negative control: an engine that declares none
    plain.reset()
    assert plain.oracle.match("", FIRST, ()).max_reuse == 0
