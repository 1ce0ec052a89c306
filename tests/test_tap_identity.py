"""Identity at the batch boundary: the tap labels each batch row with the server scheduler's id
of its request and ties that id to the reply's ``id`` at admission (tap/identity.py); the
ledger then attributes rows by id and says how (``Found.attribution``), guessing only for a
server whose scheduler it does not know. From recorded tap files (fast), the hooks on stand-in
batch classes (fast), and mlx_lm.server 0.32.2 under waves (slow)."""

from __future__ import annotations

import base64
import dataclasses
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_prefixcache.adapters.http.tapped import apply_tap
from pytest_prefixcache.checks.coverage import ATTRIBUTION, attribution_of
from pytest_prefixcache.tap import TapReader, identity
from pytest_prefixcache.tap.tracks import TapLedger
from pytest_prefixcache.types import Outcome

VOCAB = 8


def lp(top: int, shift: float = 0.0) -> str:
    v = np.full(VOCAB, -5.0, dtype=np.float32)
    v[top] = -0.1 + shift
    return base64.b64encode(v.tobytes()).decode("ascii")


def row(b: int, a: int, ids: list[int], top: int, label: str | None, shift: float = 0.0) -> dict:
    out: dict[str, Any] = {"b": b, "a": a, "pad": 0, "ids": ids, "lp": lp(top, shift)}
    if label is not None:
        out["id"] = label
    return out


def write(path: Path, lines: list[Any]) -> None:
    """``lines``: (cache, rows) per forward call, or (reply id, label) per admission."""
    with path.open("a") as f:
        for seq, (first, second) in enumerate(lines):
            if isinstance(second, str):
                f.write(json.dumps({"admit": second, "reply": first, "pid": 1}) + "\n")
                continue
            n = max(len(r["ids"]) for r in second)
            rec = {"seq": seq, "cls": "M", "n": n, "batch": len(second), "offset": 0}
            f.write(json.dumps({**rec, "pid": 1, "cache": f"1:{first}", "rows": second}) + "\n")


def ledger(tmp_path: Path, lines: list[Any]) -> TapLedger:
    path = tmp_path / "tap.jsonl"
    write(path, lines)
    return TapLedger(TapReader(path))


SAME = [1, 2, 9, 9, 9, 6]  # two requests with this very prompt, in flight together


def twins(labelled: bool) -> list[Any]:
    """The two identical prompts prefilled in one batch, their first tokens 3 (request x) and
    4 (request y: a batch's numerics), each decoding one step; admitted as ``x`` and ``y``."""
    x, y = ("1:1:0", "1:1:1") if labelled else (None, None)
    admissions = [("reply-x", x), ("reply-y", y)] if labelled else []
    return [
        *admissions,
        ("p", [row(0, 6, SAME, 3, x), row(0, 6, SAME, 4, y, shift=0.01)]),
        ("g", [row(6, 7, [3], 4, x), row(6, 7, [4], 2, y)]),
    ]


def reply(text: str = "") -> Outcome:
    return Outcome(prompt_tokens=6, token_ids=tuple(SAME), text=text)


def test_identical_prompts_in_flight_go_to_their_own_rows_by_id(tmp_path: Path) -> None:
    led = ledger(tmp_path, twins(labelled=True))
    y, _ = apply_tap(led, reply(), 2, 2, wait=0, reply_id="reply-y")  # y's reply comes in first
    x, _ = apply_tap(led, reply(), 2, 2, wait=0, reply_id="reply-x")
    assert (y.served, y.tokens, y.attribution) == (1, (4, 2), "id")
    assert y.logits is not None and y.logits[4] == pytest.approx(-0.09)  # its own row
    assert (x.served, x.tokens, x.attribution) == (0, (3, 4), "id")
    assert led.received == 2


def test_without_labels_the_same_replies_are_crossed_and_say_guessed(tmp_path: Path) -> None:
    # the negative control: the same rows unlabelled, no decoder: y's reply takes x's rows
    led = ledger(tmp_path, twins(labelled=False))
    y, _ = apply_tap(led, reply(), 2, 2, wait=0, reply_id="reply-y")
    assert (y.served, y.tokens, y.attribution) == (0, (3, 4), "guessed")


def test_an_unlabelled_guess_never_takes_a_track_admitted_to_another_reply(tmp_path: Path) -> None:
    led = ledger(tmp_path, twins(labelled=True))
    stranger, _ = apply_tap(led, reply(), 2, 2, wait=0, reply_id="reply-x")
    assert stranger.served == 0
    with pytest.raises(Exception, match="no tap record ends"):  # y's track is y's only
        apply_tap(led, reply(), 2, 2, wait=0, reply_id="reply-unknown")


def test_a_row_labelled_with_another_requests_id_is_detected(tmp_path: Path) -> None:
    # x (6 tokens) and z (4 tokens) decode in one batch; the scheduler's labels of the decode
    # call are swapped, so each labelled row starts where the other request's rows ended
    x, z = "1:1:0", "1:1:1"
    short = [1, 2, 3, 5]
    good = [
        ("reply-x", x),
        ("reply-z", z),
        ("p", [row(0, 6, SAME, 3, x), row(0, 4, short, 5, z)]),
        ("g", [row(6, 7, [3], 4, x), row(4, 5, [5], 2, z)]),
    ]
    swapped = [*good[:3], ("g", [row(6, 7, [3], 4, z), row(4, 5, [5], 2, x)])]
    led = ledger(tmp_path, good)
    out, problems = apply_tap(led, reply(), 2, 2, wait=0, reply_id="reply-x")
    assert (out.attribution, problems) == ("id", [])
    (tmp_path / "swapped").mkdir()
    bad = ledger(tmp_path / "swapped", swapped)
    out, problems = apply_tap(bad, reply(), 1, 1, wait=0, reply_id="reply-x")
    assert out.attribution == "guessed"
    assert any("labelled '1:1:0' starts at KV offset 4" in p for p in problems), problems


def test_one_request_at_a_time_is_sequential_and_interleaved_ones_are_guessed(
    tmp_path: Path,
) -> None:
    other = [1, 2, 3, 5, 5, 5]
    alone = [("p", [row(0, 6, SAME, 3, None)]), ("p", [row(6, 7, [3], 4, None)])]
    led = ledger(tmp_path, alone)
    out, _ = apply_tap(led, reply(), 2, 2, wait=0)
    assert out.attribution == "sequential"
    (tmp_path / "b").mkdir()
    mixed = [
        ("p", [row(0, 6, SAME, 3, None)]),
        ("q", [row(0, 6, other, 2, None)]),  # another request's prefill between x's calls
        ("p", [row(6, 7, [3], 4, None)]),
    ]
    led = ledger(tmp_path / "b", mixed)
    out, _ = apply_tap(led, reply(), 2, 2, wait=0)
    assert out.attribution == "guessed"


def test_a_request_counts_the_weaker_of_its_two_runs_attribution() -> None:
    by_id, guessed = Outcome(attribution="id"), Outcome(attribution="guessed")
    assert attribution_of(by_id, Outcome(attribution="sequential")) == "sequential"
    assert attribution_of(guessed, by_id) == "guessed"
    assert attribution_of(by_id, by_id) == "id"
    assert attribution_of(Outcome(), Outcome()) is None


def test_the_hooks_label_rows_with_the_batch_uids_and_admit_the_reply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """mlx-lm's classes stood in for: the labels a forward sees inside a batch's step are its
    uids in row order (after a filter too), and the insert that follows the HTTP request's
    tokenization admits the reply's id."""
    seen: list[list[str] | None] = []

    class Batch:
        def __init__(self, uids: list[int]) -> None:
            self.uids = uids

        def _step(self) -> None:
            seen.append(identity.current_labels())

        def prompt(self, tokens: Any) -> None:
            seen.append(identity.current_labels())

    class Generator:
        def __init__(self) -> None:
            self.count = 0
            self.batch = Batch([])

        def _next(self) -> None:
            self.batch._step()

        def insert_segments(self, segments: Any, **kw: Any) -> list[int]:
            self.batch.uids.append(self.count)
            self.count += 1
            return [self.count - 1]

    class Handler:
        def __init__(self, reply_id: str, single: bool = False) -> None:
            self.request_id, self.single = reply_id, single

        def handle_completion(self, request: Any, stop_words: Any) -> Any:
            if self.single:  # served alone: no BatchGenerator
                return responder._serve_single((None, request, None), None)
            return responder._tokenize(None, request, None), gen.insert_segments([[1]])

    class Responder:
        def _tokenize(self, tokenizer: Any, request: Any, args: Any) -> str:
            return "tokens"

        def _serve_single(self, item: Any, stream: Any) -> None:
            seen.append(identity.current_labels())

    gen_mod = types.ModuleType("mlx_lm.generate")
    gen_mod.PromptProcessingBatch = Batch  # type: ignore[attr-defined]
    gen_mod.GenerationBatch = Batch  # type: ignore[attr-defined]
    gen_mod.BatchGenerator = Generator  # type: ignore[attr-defined]
    srv_mod = types.ModuleType("mlx_lm.server")
    srv_mod.APIHandler = Handler  # type: ignore[attr-defined]
    srv_mod.ResponseGenerator = Responder  # type: ignore[attr-defined]
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # install adds an import hook
    monkeypatch.setitem(sys.modules, "mlx_lm.generate", gen_mod)
    monkeypatch.setitem(sys.modules, "mlx_lm.server", srv_mod)
    admitted: list[tuple[str, str]] = []

    class Sink:
        def admit(self, label: str, reply_id: str, scheduler: str) -> None:
            admitted.append((label, reply_id))

    done = identity.install(Sink())
    assert "mlx_lm.generate:GenerationBatch._step" in done
    assert "mlx_lm.server:ResponseGenerator._serve_single" in done
    gen, responder = Generator(), Responder()
    Handler("chatcmpl-a").handle_completion(object(), None)
    Handler("chatcmpl-b").handle_completion(object(), None)
    gen._next()
    gen.batch.uids = [1]  # uid 0 finished and was filtered out
    gen._next()
    pid = str(__import__("os").getpid())
    serial = gen._prefixcache_serial  # type: ignore[attr-defined]
    assert admitted == [(f"{pid}:{serial}:0", "chatcmpl-a"), (f"{pid}:{serial}:1", "chatcmpl-b")]
    assert seen == [[f"{pid}:{serial}:0", f"{pid}:{serial}:1"], [f"{pid}:{serial}:1"]]
    assert identity.current_labels() is None  # outside a batch's step: no label
    Handler("chatcmpl-c", single=True).handle_completion(object(), None)
    assert admitted[-1][1] == "chatcmpl-c" and seen[-1] == [admitted[-1][0]]


@pytest.mark.slow
def test_mlx_lm_server_waves_are_attributed_by_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every wave request's rows on mlx_lm.server are its own by the scheduler's id, and its
    model ran one prefill per reply."""
    pytest.importorskip("mlx_lm")
    # the servers import this checkout's tap, whatever the environment has installed
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    from test_adapters_waves import WAVES

    from pytest_prefixcache import Verifier
    from pytest_prefixcache.adapters import presets

    engine = presets.mlx_lm_server(concurrency=4)
    try:
        verifier = Verifier(engine)
        steps = verifier.run_waves(WAVES)
        assert verifier.report.coverage[ATTRIBUTION] == {"applied": len(steps)}
        assert {s.cached.attribution for s in steps} == {"id"}
        assert engine.tap_disagreements == [] and engine.request_count_problems() == []
        batched = [r for r in engine._readers[id(engine.server)].records() if r.batch > 1]
        assert batched and all(row.label for r in batched for row in r.rows)
    finally:
        engine.close()


class Attributed:
    """``inner`` (a fake engine) whose replies say how an observer attributed them."""

    def __init__(self, inner: Any, how: str) -> None:
        self.inner, self.how = inner, how
        self.max_concurrency = inner.max_concurrency

    def run(self, request: Any, *, use_cache: bool) -> Outcome:
        out = self.inner.run(request, use_cache=use_cache)
        return dataclasses.replace(out, attribution=self.how)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _waves(engine: Any, runs: int = 5) -> Any:
    from plugin_engines import FakeEngine  # noqa: F401  (tests' own fakes)
    from test_waves import TWO_WAVES

    from pytest_prefixcache import Verifier

    v = Verifier(engine)
    for _ in range(runs):
        v.run_waves(TWO_WAVES)
    return v


def test_a_guessed_wave_failure_that_does_not_reproduce_alone_is_inconclusive() -> None:
    from plugin_engines import FakeEngine

    from pytest_prefixcache.output.report import INCONCLUSIVE

    # the wrong batch row only happens with requests in flight: one at a time it is right
    v = _waves(Attributed(FakeEngine(concurrent=4, mix_rows=True), "guessed"))
    assert v.report.findings[INCONCLUSIVE] >= 1 and v.report.verdict == "inconclusive"
    assert any("does not fail" in f for f in v.report.finding_examples)
    assert v.report.verdict_lines()[0].startswith("verdict: INCONCLUSIVE")


@pytest.mark.parametrize("how", ["id", "sequential"])
def test_a_wave_failure_attributed_by_id_fails_without_a_replay(how: str) -> None:
    from plugin_engines import FakeEngine

    from pytest_prefixcache import EquivalenceFailure

    # the negative control of the above: the same engine, its rows not guessed
    with pytest.raises(EquivalenceFailure) as info:
        _waves(Attributed(FakeEngine(concurrent=4, mix_rows=True), how))
    assert "sequential replay" not in str(info.value)


def test_a_guessed_wave_failure_that_reproduces_alone_fails_saying_so() -> None:
    from plugin_engines import FakeEngine

    from pytest_prefixcache import PrefixCacheError

    with pytest.raises(PrefixCacheError) as info:  # wrong on every hit, in flight or not
        _waves(Attributed(FakeEngine(concurrent=4, drift=True), "guessed"))
    assert "confirmed one request at a time" in str(info.value)


def test_a_labelled_prompt_chunk_that_looks_like_a_decode_step_is_still_its_prompt(
    tmp_path: Path,
) -> None:
    # a one-position prompt chunk (a segment boundary) whose token happens to be the greedy
    # token of the chunk before it reads like a decode step: unlabelled, the row ending at the
    # prompt length looks like a longer request's step, and no track answers the prompt
    prompt = [1, 2, 3, 4, 5, 6]

    def calls(x: str | None) -> list[Any]:
        return [
            *([("reply-x", x)] if x else []),
            ("p", [row(0, 4, prompt[:4], 5, x)]),
            ("p", [row(4, 5, [5], 6, x)]),
            ("g", [row(5, 6, [6], 2, x)]),
        ]

    out = Outcome(prompt_tokens=6, token_ids=tuple(prompt))
    led = ledger(tmp_path, calls("1:1:0"))
    got, _ = apply_tap(led, out, 1, 1, wait=0, reply_id="reply-x")
    assert (got.tokens, got.cached_tokens, got.attribution) == ((2,), 0, "id")
    (tmp_path / "bare").mkdir()
    with pytest.raises(Exception, match="no tap record ends"):
        apply_tap(ledger(tmp_path / "bare", calls(None)), out, 1, 1, wait=0)


def test_hooks_reach_a_scheduler_module_imported_after_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose ``main`` imports the scheduler itself (tests/wrong_row_mlx_lm.py) gets
    the hooks when that import happens; a module the families do not name is left alone."""
    (tmp_path / "late_scheduler_mod.py").write_text("class Batch:\n    uids = [7]\n")
    (tmp_path / "other_mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))

    def family(sink: Any) -> list[str]:
        mod = sys.modules.get("late_scheduler_mod")
        return [] if mod is None else [f"late_scheduler_mod:Batch uids={mod.Batch.uids}"]

    monkeypatch.setattr(identity, "FAMILIES", ((("late_scheduler_mod",), family),))
    heard: list[list[str]] = []
    assert identity.install(object(), heard.append) == []  # type: ignore[arg-type]
    import other_mod  # noqa: F401

    assert heard == []
    import late_scheduler_mod  # noqa: F401

    assert heard == [["late_scheduler_mod:Batch uids=[7]"]]
    for name in ("late_scheduler_mod", "other_mod"):
        monkeypatch.delitem(sys.modules, name)
