"""The tap under concurrency: every batch row recorded, each request's rows followed from
call to call (padded prefill rows, a batch split off, rows extended into another batch), a
reply attributed by its prompt's ids, the served order and the prefills counted; on
mlx_lm.server 0.32.2 (it batches concurrent text requests) the waves pass through the tap, and
a tap fed another batch row fails them."""

from __future__ import annotations

import base64
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from adapter_support import SYSTEM, req, user

from pytest_prefixcache.adapters.http.tapped import apply_tap, reply_fits
from pytest_prefixcache.errors import EngineError
from pytest_prefixcache.tap import TapReader
from pytest_prefixcache.tap.tracks import TapLedger
from pytest_prefixcache.types import Outcome

VOCAB = 8


def lp(top: int, shift: float = 0.0) -> str:
    v = np.full(VOCAB, -5.0, dtype=np.float32)
    v[top] = -0.1 + shift
    return base64.b64encode(v.tobytes()).decode("ascii")


def row(b: int, a: int, ids: list[int], top: int, pad: int = 0, shift: float = 0.0) -> dict:
    return {"b": b, "a": a, "pad": pad, "ids": ids, "lp": lp(top, shift)}


def write(path: Path, calls: list[tuple[str, list[dict[str, Any]]]]) -> None:
    with path.open("a") as f:
        for seq, (cache, rows) in enumerate(calls):
            n = max(len(r["ids"]) for r in rows)
            rec = {"seq": seq, "cls": "M", "n": n, "batch": len(rows), "offset": 0}
            f.write(json.dumps({**rec, "pid": 1, "cache": f"1:{cache}", "rows": rows}) + "\n")


# Two prompts batched the way mlx_lm 0.32.2 does: the prompt but its last token prefilled in a
# prompt batch (the shorter row right-padded), split off to a batch of its own for the first
# token, which later joins the running decode batch.
A = [1, 2, 3, 4, 5, 6]  # 6 tokens, cold
B = [1, 2, 3, 7, 2]  # 5 tokens, 3 of them reused
CALLS = [
    ("p", [row(0, 5, A[:5], 0), row(3, 8, [7, 0, 0, 0, 0], 0, pad=4)]),  # B: 1 real + 4 pads
    ("g", [row(5, 6, [6], 3), row(4, 5, [2], 5)]),  # the first tokens: A -> 3, B -> 5
    ("g", [row(6, 7, [3], 4), row(5, 6, [5], 4)]),
    ("g", [row(7, 8, [4], 4)]),  # B finished and was filtered out
]


def ledger(tmp_path: Path, calls: list[tuple[str, list[dict[str, Any]]]]) -> TapLedger:
    path = tmp_path / "tap.jsonl"
    write(path, calls)
    return TapLedger(TapReader(path))


def test_each_request_gets_its_own_rows(tmp_path: Path) -> None:
    led = ledger(tmp_path, CALLS)
    b = led.find(5, B, 2)
    a = led.find(6, A, 3)
    assert a is not None and b is not None
    assert (a.reused, a.ids_checked, [int(np.argmax(r.logprobs)) for r in a.steps]) == (
        0,
        True,
        [3, 4, 4],
    )
    assert (b.reused, b.ids_checked, [r.after for r in b.steps]) == (3, True, [5, 6])
    assert a.served < b.served and led.received == 2
    assert led.claim(a) and not led.claim(a)  # one reply per track


def test_a_padded_row_is_never_a_first_token(tmp_path: Path) -> None:
    # B's padded prefill row ends at offset 8: a prompt of 8 tokens finds nothing there
    assert ledger(tmp_path, CALLS).find(8, None, 1) is None


def test_another_prompt_of_the_same_length_is_told_apart_by_its_ids(tmp_path: Path) -> None:
    other = [9, 9, 9, 9, 9, 6]
    calls = [
        ("p", [row(0, 5, A[:5], 0), row(0, 5, other[:5], 0)]),
        ("g", [row(5, 6, [6], 3, shift=0.01), row(5, 6, [6], 3, shift=0.02)]),
    ]
    led = ledger(tmp_path, calls)
    second = led.find(6, other, 1)
    assert second is not None and second.served == 1 and led.claim(second)
    first = led.find(6, A, 1)
    assert first is not None and first.served == 0
    assert first.steps[0].logprobs[3] == pytest.approx(-0.09)


def test_the_prefills_a_server_ran_are_counted(tmp_path: Path) -> None:
    led = ledger(tmp_path, CALLS)
    led.started()
    assert (led.sent, led.warmup, led.received) == (0, 2, 0)  # computed before any request
    write(tmp_path / "tap.jsonl", [("q", [row(0, 4, [1, 2, 3, 4], 2)])])
    led.count_sent()
    led.refresh()
    assert (led.sent, led.received) == (1, 1)


# vllm-mlx 0.6.0 --continuous-batching --chunked-prefill-tokens 32 on a 34-token prompt (the
# records of its tap, cold server, token ids mapped into VOCAB): a 32-position chunk, a chunk of
# ONE position (it stops 1 short of the end), then the last prompt token in the first decode
# call, on the batch's new cache, and the decode steps fed the greedy tokens.
C = [t % 7 for t in range(34)]
CHUNKED = [
    ("c", [row(0, 32, C[:32], 6)]),  # the greedy 6 is not C[32] = 4: a prompt token follows
    ("c", [row(32, 33, [C[32]], 2)]),  # the chunk of one position
    ("d", [row(33, 34, [C[33]], 3)]),  # C[33] = 5, not its greedy 2: the prompt's last token
    ("d", [row(34, 35, [3], 1)]),
    ("d", [row(35, 36, [1], 1)]),
]


@pytest.mark.parametrize("fault", ["none", "second-prefill"])
def test_a_chunk_of_one_position_stays_in_its_request(tmp_path: Path, fault: str) -> None:
    # "second-prefill" is the control: after a decode step, a one-position row not fed its
    # greedy token at the next offset is another prefill (a resumed request), counted
    calls = CHUNKED + ([("d", [row(36, 37, [4], 1)])] if fault != "none" else [])
    led = ledger(tmp_path, calls)
    found = led.find(34, C, 3)
    assert found is not None and (found.reused, found.ids_checked) == (0, True)
    assert [r.after for r in found.steps] == [34, 35, 36]
    assert led.received == (1 if fault == "none" else 2)
    led.count_sent()
    assert (led.count_problem() == "") == (fault == "none")
    # a decode step is no prompt's end: the 35-token prompt C + [3] is not this track's
    assert led.find(35, [*C, 3], 1) is None


def _mlx_lm(concurrency: int, launcher: str = "mlx_lm.server:main") -> Any:
    pytest.importorskip("mlx_lm")
    from pytest_prefixcache.adapters import presets
    from pytest_prefixcache.adapters.http.openai import OpenAIEngine
    from pytest_prefixcache.package_data import engine_model

    if launcher == "mlx_lm.server:main":
        return presets.mlx_lm_server(concurrency=concurrency)
    model = engine_model(None, default="tiny-llama", vision=False, who="mlx_lm.server")
    tail = f"--model {model} --host 127.0.0.1 --port {{port}}"
    return OpenAIEngine(
        f"{presets.TAP} {launcher} {tail}",
        cold="server",
        cold_cmd=f"{presets.TAP} mlx_lm.server:main {tail} --prompt-cache-size 0",
        supports_images=False,
        tap=True,
        render=presets.TextRenderer(model),
        check_labels=False,
        concurrency=concurrency,
        env={"PYTHONPATH": str(Path(__file__).parent)},
    )


@pytest.mark.slow
@pytest.mark.parametrize("concurrency", [2, 4])
def test_mlx_lm_server_passes_the_waves_through_the_tap(concurrency: int) -> None:
    from test_adapters_waves import WAVES

    from pytest_prefixcache import Verifier
    from pytest_prefixcache.verify.concurrent import CONCURRENT

    engine = _mlx_lm(concurrency)
    try:
        verifier = Verifier(engine)
        steps = verifier.run_waves(WAVES)
        assert verifier.report.coverage[CONCURRENT] == {"applied": 6}  # the tap's order
        assert verifier.report.worst_diff == 0.0 and verifier.report.cache_hits >= 3
        assert len({s.cached.served for s in steps}) == 6
        assert engine.tap_disagreements == [] and engine.request_count_problems() == []
        batched = [r for r in engine._readers[id(engine.server)].records() if r.batch > 1]
        assert batched, "no forward call batched two requests"
    finally:
        engine.close()


@pytest.mark.slow
@pytest.mark.timing
def test_a_server_storing_another_rows_cache_fails_the_waves() -> None:
    """The planted bug shows only when the server batches the wave's requests together, which
    depends on thread timing: up to five tries, skipped (saying so) if it never batched them."""
    from test_adapters_waves import WAVES

    from pytest_prefixcache import EquivalenceFailure, Verifier

    engine = _mlx_lm(3, "wrong_row_mlx_lm:main")
    try:
        for _ in range(5):
            try:
                Verifier(engine).run_waves(WAVES)
            except EquivalenceFailure as exc:
                assert re.search(r"wave \d+, cache: .*: logits differ", str(exc)), exc
                return
            engine.reset()
    finally:
        engine.close()
    pytest.skip("the wrong-row server passed 5 runs of the waves: its batches never mixed rows")


def test_identical_prompts_in_flight_go_by_the_replys_own_reuse(tmp_path: Path) -> None:
    # two copies of A: one prefilled from 0, the other resumed from the first's 5 positions
    calls = [
        ("p", [row(0, 5, A[:5], 0)]),
        ("g", [row(5, 6, [6], 3)]),
        ("h", [row(5, 6, [6], 3)]),
    ]
    led = ledger(tmp_path, calls)
    resumed = led.find(6, A, 1, said=5)  # the reply said 5 cached: the track that shows it
    assert resumed is not None and (resumed.reused, resumed.served) == (5, 1)
    assert led.claim(resumed)
    rest = led.find(6, A, 1, said=5)  # a reply whose figure agrees with no track left
    assert rest is not None and rest.reused == 0


#: rapid-mlx 0.16.10 with --shared-prefix-wait-tokens 1, two copies of A in flight: the first
#: prefilled cold (its reply says nothing: cached_tokens is omitted when 0), the second waited
#: for its prompt state and resumed from 5 positions, feeding the last prompt token again, while
#: its reply says the whole prompt, 6 (the engine's one-token over-claim on an exact hit).
WAITED = [("p", [row(0, 5, A[:5], 0)]), ("g", [row(5, 6, [6], 3)]), ("h", [row(5, 6, [6], 3)])]


@pytest.mark.parametrize("first", ["hit", "cold"])
def test_a_hit_that_over_claims_by_one_still_gets_its_own_track(tmp_path: Path, first: str) -> None:
    # whichever reply the adapter reads first, each gets its own track: the hit reply only
    # its one-token over-claim, the cold reply nothing (the ledger read the hit's track as
    # the cold reply's: "API cached_tokens=6" on a track that reused 0, and None on one of 5)
    led = ledger(tmp_path, WAITED)
    hit = Outcome(prompt_tokens=6, cached_tokens=6, token_ids=tuple(A))
    cold = Outcome(prompt_tokens=6, cached_tokens=None, token_ids=tuple(A))
    order = [hit, cold] if first == "hit" else [cold, hit]
    done = {id(o): apply_tap(led, o, 1, 1, wait=0.0) for o in order}
    (h, hit_problems), (c, cold_problems) = done[id(hit)], done[id(cold)]
    assert (h.cached_tokens, c.cached_tokens) == (5, 0)
    assert cold_problems == []
    # the negative control: the over-claim itself is still reported, by its one token
    assert hit_problems == ["API cached_tokens=6 but the tap saw 1 of 6 prompt tokens prefilled"]


def test_the_closest_track_is_no_excuse_for_a_figure_no_track_shows(tmp_path: Path) -> None:
    # a reply claiming 3 of A's 6 tokens, with tracks that reused 0 and 5: it gets the closest
    # (5) and is still told it claimed what the model did not do
    led = ledger(tmp_path, WAITED)
    out, problems = apply_tap(
        led, Outcome(prompt_tokens=6, cached_tokens=3, token_ids=tuple(A)), 1, 1, wait=0.0
    )
    assert out.cached_tokens == 5
    assert problems == ["API cached_tokens=3 but the tap saw 1 of 6 prompt tokens prefilled"]


#: Two requests with the same text and other images of one size (vllm-mlx 0.6.0 --mllm): the
#: same length and the same ids (image pads are one token), prefilled in one batch, each
#: answering its own greedy tokens: 3 then 4, and 4 then 2.
PADS = [1, 2, 9, 9, 9, 6]
TWINS = [
    ("p", [row(0, 6, PADS, 3), row(0, 6, PADS, 4)]),
    ("p", [row(6, 7, [3], 4), row(6, 7, [4], 2)]),
]


def letters(ids: Any) -> str:
    return "".join("abcdefgh"[i] for i in ids)


@pytest.mark.parametrize("by", ["text", "tokens"])
def test_prompts_with_the_same_ids_go_by_what_each_reply_generated(tmp_path: Path, by: str) -> None:
    # the second request's reply is read first: it gets its own track, not the earliest
    led = ledger(tmp_path, TWINS)
    second = Outcome(prompt_tokens=6, token_ids=tuple(PADS), text="ec", tokens=())
    first = Outcome(prompt_tokens=6, token_ids=tuple(PADS), text="de", tokens=())
    if by == "tokens":  # an API that names its tokens (rapid-mlx's logprobs)
        second, first = replace(second, tokens=(4, 2)), replace(first, tokens=(3, 4))
    b, _ = apply_tap(led, second, 2, 2, wait=0.0, decode=letters)
    a, _ = apply_tap(led, first, 2, 2, wait=0.0, decode=letters)
    assert (b.served, b.tokens, a.served, a.tokens) == (1, (4, 2), 0, (3, 4))


def test_a_reply_waits_for_a_twin_track_that_is_still_generating(tmp_path: Path) -> None:
    # the same ids in two batches, both first tokens 3 ("d"); the second batch's next step
    # is not written yet: a reply "dc" fits both as far as the records go, and is not
    # settled until it is
    path = tmp_path / "tap.jsonl"
    write(path, [("p", [row(0, 6, PADS, 3)]), ("q", [row(0, 6, PADS, 3, shift=0.01)])])
    write(path, [("p", [row(6, 7, [3], 4)])])  # the first track's step: "de"
    led = TapLedger(TapReader(path))
    fits = reply_fits(Outcome(text="dc"), letters)
    early = led.find(6, PADS, 2, fits=fits)
    assert early is not None and early.served == 0 and not early.settled
    write(path, [("q", [row(6, 7, [3], 2, shift=0.01)])])  # the second track's: "dc"
    late = led.find(6, PADS, 2, fits=fits)
    assert late is not None and late.served == 1 and late.settled


def test_prompts_prefilled_alone_join_a_batch_in_the_order_they_were_run(tmp_path: Path) -> None:
    # vllm-mlx 0.6.0 --mllm: two prompts with the same ids, each prefilled in a batch of its
    # own, both first tokens 3, join one decode batch in that order; the rows' offsets and
    # inputs cannot tell them apart, the order does (the newest first crossed them: the
    # second prompt's first-token logits with the first one's steps)
    calls = [
        ("p1", [row(0, 6, PADS, 3)]),
        ("p2", [row(0, 6, PADS, 3, shift=0.01)]),
        ("g", [row(6, 7, [3], 4), row(6, 7, [3], 2)]),
    ]
    led = ledger(tmp_path, calls)
    first, second = (
        led.find(6, PADS, 2, fits=reply_fits(Outcome(text=t), letters)) for t in ("de", "dc")
    )
    assert first is not None and second is not None
    assert (first.served, second.served) == (0, 1)
    assert second.steps[0].logprobs[3] == pytest.approx(-0.09)  # its own first-token row


def test_without_the_replys_text_prompts_with_the_same_ids_are_a_guess(tmp_path: Path) -> None:
    # the negative control: with no decoder, the second reply read first takes the earliest
    # track, the first request's logits (the vllm-mlx --mllm "image exchange" of the waves)
    led = ledger(tmp_path, TWINS)
    b, _ = apply_tap(led, Outcome(prompt_tokens=6, token_ids=tuple(PADS), text="ec"), 2, 2, wait=0)
    assert (b.served, b.tokens) == (0, (3, 4))


def test_a_reply_answered_from_the_other_image_keeps_that_rows_logits(tmp_path: Path) -> None:
    # an engine that really answered the first request from the second one's pixels: its
    # reply's text is the second track's, so it gets that track's logits (and the waves'
    # comparison with the first request alone, cold, still fails)
    led = ledger(tmp_path, TWINS)
    out = Outcome(prompt_tokens=6, token_ids=tuple(PADS), text="ec")
    a, _ = apply_tap(led, out, 2, 2, wait=0.0, decode=letters)
    assert (a.served, a.tokens) == (1, (4, 2))


def test_a_request_left_unanswered_may_have_run_or_not(tmp_path: Path) -> None:
    led = ledger(tmp_path, [])
    led.started()
    write(tmp_path / "tap.jsonl", [("q", [row(0, 4, [1, 2, 3, 4], 2)])])
    led.count_sent()
    led.count_unanswered()  # refused (a 503): no prefill
    assert led.count_problem() == ""
    write(tmp_path / "tap.jsonl", [("r", [row(0, 3, [1, 2, 5], 2)])])  # or failed after it
    assert led.count_problem() == ""
    write(tmp_path / "tap.jsonl", [("s", [row(0, 2, [6, 7], 2)])])  # another client's prefill
    assert "answered 1 request(s) (and left 1 unanswered" in led.count_problem()


def test_a_request_answered_without_a_prefill_is_still_reported(tmp_path: Path) -> None:
    led = ledger(tmp_path, [("q", [row(0, 4, [1, 2, 3, 4], 2)])])
    led.count_sent()
    led.count_unanswered()  # an unanswered request does not excuse an answered one
    led.count_sent()  # answered from stored logits: no forward call recorded
    problem = led.count_problem()
    assert problem.startswith("answered 2 request(s)") and "ran 1 prefill(s)" in problem


def _request() -> Any:
    return req(SYSTEM, user("Tell me about the mountains."), max_new_tokens=2)


def _stub(fault: str) -> Any:
    from pytest_prefixcache.adapters.http.openai import OpenAIEngine

    cmd = [sys.executable, str(Path(__file__).parent / "claims_stub_server.py"), "--port", "{port}"]
    return OpenAIEngine(
        [*cmd, "--fault", fault],
        cold="server",
        cold_cmd=[*cmd, "--no-cache"],
        supports_images=False,
        tap=True,
        top_logprobs=5,
        start_timeout=60,
    )


def test_a_refused_request_is_no_request_count_fault() -> None:
    # oMLX 0.7.0's memory gate answered 503 (no forward call): counted as a request sent, it
    # made every later wave on that server fail "sent N request(s) but its model ran N-1"
    engine = _stub("refuse-first")
    try:
        request = _request()
        with pytest.raises(EngineError, match="answered 503"):
            engine.run(request, use_cache=True)
        engine.run(request, use_cache=True)
        assert engine.request_count_problems() == []
    finally:
        engine.close()


def test_a_reply_served_without_the_model_is_a_request_count_fault() -> None:
    engine = _stub("replay-repeat")
    try:
        request = _request()
        engine.run(request, use_cache=True)
        with pytest.raises(EngineError):  # the tap has no row for the repeat
            engine.run(request, use_cache=True)
        (problem,) = engine.request_count_problems()
        assert "answered 2 request(s) but its model ran 1 prefill(s)" in problem
    finally:
        engine.close()


def test_a_count_mismatch_is_reported_once(tmp_path: Path) -> None:
    led = ledger(tmp_path, [("q", [row(0, 4, [1, 2, 3, 4], 2)])])
    led.count_sent()
    led.count_sent()  # one answered without a prefill: reported ...
    assert "ran 1 prefill(s) (the logit" in led.count_problem()
    write(tmp_path / "tap.jsonl", [("r", [row(0, 3, [1, 2, 5], 2)])])
    led.count_sent()  # ... and the next request, which ran its own, is judged alone
    assert led.count_problem() == ""
    led.count_sent()  # a second one answered without a prefill is reported again
    assert "since the last mismatch reported" in led.count_problem()


@pytest.mark.parametrize("fault", ["double-prefill", "none"])
def test_a_request_that_ran_the_model_twice_fails_the_sequential_path(fault: str) -> None:
    # the sequential path asks after every request (the waves after every wave); "none" is
    # the control: the same stub, one prefill per request, passes
    from pytest_prefixcache import EngineFault, Verifier

    engine = _stub(fault)
    try:
        verifier = Verifier(engine)
        if fault == "none":
            verifier.run([_request(), _request()])
            return
        with pytest.raises(EngineFault) as info:
            verifier.run([_request(), _request()])
        text = str(info.value)
        assert "request count: " in text and "request 0" in text
        assert "answered 1 request(s) but its model ran 2 prefill(s)" in text
    finally:
        engine.close()
