"""The reuse bound from the engine (issue #32, item 3): whether a decode computed the KV of its
last generated token is declared or probed (``verify/decode_kv.py``), the bound counts that
token only when it was, and the reuse check and the summary's over-claim count are one test
(``checks.oracle.over_bound``). Negative controls: an engine that claims one token more than
it computed fails the bound; a correct engine that does compute it fails under the old
assumption (a bound without its last token)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from kv_engines import KvEngine

from pytest_prefixcache import Message, Outcome, Request, VerificationFailure, Verifier
from pytest_prefixcache.checks import CacheDesign, ReuseOracle, reuse_problems
from pytest_prefixcache.output.records import RequestRecord
from pytest_prefixcache.output.report import Report
from pytest_prefixcache.output.summary import over_claims, summarize
from pytest_prefixcache.types import ReplyOf
from pytest_prefixcache.verify.decode_kv import LastKv, last_kv_of, probe_last_kv

pytest_plugins = ["pytester"]

FIRST = Request((Message("user", ("tell me something",)),), "", 1)


def closed_loop(turns: int = 3) -> list[Request]:
    """Each turn continues the previous one by its reply (1 token on the first: max_tokens=1,
    the case seen on mlx_lm.server) and a new user turn."""
    out = [FIRST]
    for i in range(turns - 1):
        msgs = (*out[-1].messages, Message("assistant", (ReplyOf(i),)), Message("user", ("go",)))
        out.append(Request(msgs, "", 3))
    return out


def direct(what: str, fn: Callable[[], object]) -> object:
    return fn()


# -- the oracle -------------------------------------------------------------------------------
@pytest.mark.parametrize("last_kv", [True, False, None])
def test_the_bound_counts_the_last_output_token_only_when_its_kv_was_computed(
    last_kv: bool | None,
) -> None:
    o = ReuseOracle(design=CacheDesign(last_kv=last_kv))
    o.add(0, "", [1, 2, 3, 4], [], None, output=[5, 6, 7])
    m = o.match("", [1, 2, 3, 4, 5, 6, 7, 9], [])
    assert m.limit == (6 if last_kv is False else 7)  # unknown: the generous side
    said = Outcome(cached_tokens=7)
    assert bool(reuse_problems(said, m)) is (last_kv is False)  # the negative control
    assert m.exceeded_by(7) is (last_kv is False) and not m.exceeded_by(6)
    # the token oracle of a design that caches output: the last one only when computed
    cached = ReuseOracle(design=CacheDesign(outputs=True, last_kv=last_kv))
    cached.add(0, "", [1, 2, 3, 4], [], None, output=[5, 6, 7])
    assert cached.match("", [1, 2, 3, 4, 5, 6, 7, 9], []).max_reuse == (7 if last_kv else 6)


def test_a_declared_trait_that_is_not_a_bool_is_refused() -> None:
    from pytest_prefixcache.errors import EngineError

    class Odd:
        last_token_kv = "yes"

    with pytest.raises(EngineError, match="last_token_kv='yes' is not a bool or None"):
        CacheDesign.of(Odd())


# -- the verifier: a correct engine passes, one claiming one token more fails ------------------
def test_an_engine_that_computes_its_last_token_kv_passes_and_its_reuse_uses_it() -> None:
    v = Verifier(KvEngine(last_kv=True, declare=True))
    steps = v.run(closed_loop())
    n0 = len(steps[0].cached.token_ids or ())
    assert steps[1].cached.cached_tokens == n0 + 1  # the prompt + the one generated token
    assert v.report.over_claims == 0 and not any(r.over for r in v.report.records)


def test_the_old_assumption_fails_a_correct_engine_that_computes_it() -> None:
    """Negative control of the measured answer: judged as if its decode never computed its
    last token's KV, the same correct engine fails the bound (the mlx_lm.server report)."""
    with pytest.raises(VerificationFailure, match=r"cached_tokens=\d+ exceeds the maximum valid"):
        Verifier(KvEngine(last_kv=True, declare=False)).run(closed_loop())


def test_an_engine_that_claims_one_token_beyond_what_it_computed_fails() -> None:
    ok = Verifier(KvEngine(last_kv=False, declare=False))
    ok.run(closed_loop())  # the honest engine that does not compute it passes
    v = Verifier(KvEngine(last_kv=False, declare=False, overclaim=True))
    with pytest.raises(VerificationFailure) as info:
        v.run(closed_loop())
    assert info.value.check == "reuse bound"
    assert v.report.over_claims == 1 == over_claims(v.report)


# -- one function for the check and the summary -----------------------------------------------
def test_a_pass_never_prints_a_failed_bound() -> None:
    """Reuse through output tokens (a bound above the token oracle) is valid: the summary
    counts no over-claim. The negative control: a record above its bound is counted, and the
    summary says the efficiency is not judged."""
    v = Verifier(KvEngine(last_kv=True, declare=True))
    steps = v.run(closed_loop(4))
    assert any(s.match and (s.cached.cached_tokens or 0) > s.match.max_reuse for s in steps)
    v.report.allow_partial = True  # the toy engine has no fresh instance for the audit
    summary = summarize(v.report)
    text = "\n".join(summary.lines())
    assert summary.verdict == "partial" and "not judged" not in text
    assert "failures by check: none" in text
    rec = v.report.records[1]
    assert rec.bound is not None and not rec.over
    above = RequestRecord(0, 1, 20, rec.bound + 1, 10, 0.0, 0.0, 0, 0, 0, bound=rec.bound)
    bad = Report(requests=1, records=[above])
    assert over_claims(bad) == 1 and "not judged" in "\n".join(summarize(bad).lines())
    old = Report(requests=1, records=[RequestRecord(0, 1, 20, 11, 10, 0.0, 0.0, 0, 0, 0)])
    assert over_claims(old) == 1  # an older report without bounds: judged by its reusable


# -- the probe --------------------------------------------------------------------------------
@pytest.mark.parametrize("computes", [True, False])
def test_the_probe_measures_the_engine(computes: bool) -> None:
    engine = KvEngine(last_kv=computes)
    answer = last_kv_of(engine, direct)
    assert answer.computed is computes and answer.how.startswith("probed: reused ")
    assert engine.kept == []  # the probe's cache entries are gone (reset after)
    assert ("not computed" in answer.line()) is not computes


def test_a_declared_engine_is_not_probed_and_an_unprobed_one_is_unknown() -> None:
    engine = KvEngine(last_kv=False, declare=False)
    assert last_kv_of(engine, direct) == LastKv(False, "declared by the engine: last_token_kv")
    assert engine.calls == 0

    class Silent:  # no trait, no probe: the generous bound, said so
        def run(self, request: Request, *, use_cache: bool) -> Outcome:
            raise AssertionError("not probed")

        def reset(self) -> None: ...

    answer = last_kv_of(Silent(), direct)  # type: ignore[arg-type]
    assert answer.computed is None and "not measured" in answer.line()
    assert "counts every output token" in answer.line()


def test_the_probe_says_why_it_cannot_tell() -> None:
    class NoIds(KvEngine):
        def run(self, request: Request, *, use_cache: bool) -> Outcome:
            out = super().run(request, use_cache=use_cache)
            return Outcome(logits=out.logits, tokens=out.tokens, text=out.text, cached_tokens=0)

    answer = probe_last_kv(NoIds(last_kv=True), direct)
    assert answer.computed is None and "reports no prompt token ids" in answer.how

    class Rerendered(KvEngine):  # the next turn carries another text than the reply
        def run(self, request: Request, *, use_cache: bool) -> Outcome:
            out = super().run(request, use_cache=use_cache)
            return Outcome(**{**out.__dict__, "text": "Z"})

    answer = probe_last_kv(Rerendered(last_kv=True), direct)
    assert answer.computed is None and "does not carry the reply's generated" in answer.how


# -- the plugin: the probe runs before the first stream, the report says what it found --------
def test_the_plugin_probes_and_reports_the_answer(pytester: pytest.Pytester) -> None:
    source = (Path(__file__).with_name("kv_engines.py")).read_text(encoding="utf-8")
    pytester.makepyfile(kvengines=source + "\n\ndef probed():\n    return KvEngine(last_kv=True)\n")
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning",
        "--prefixcache-verify", "--prefixcache-engine=kvengines:probed",
        "--prefixcache-examples=2", "--prefixcache-seed=1", "--prefixcache-report=r.json",
        "-k", "test_request_streams",
    )  # fmt: skip
    result.stdout.fnmatch_lines(["KV of a decode's last token: computed (probed: reused *"])
    report = json.loads((pytester.path / "r.json").read_text(encoding="utf-8"))
    assert report["last_kv"].startswith("KV of a decode's last token: computed (probed")
    assert report["over_claims"] == 0


def test_the_oracle_learns_every_token_a_claims_extended_decode_produced() -> None:
    """The claims check asks a tapped server for extra decode steps and cuts the reply back:
    the cache holds all of them, so the oracle is given all of them (the tap's argmax)."""
    import numpy as np

    from pytest_prefixcache.types import Claims
    from pytest_prefixcache.verify.decode_kv import decoded_tokens

    steps = tuple(np.eye(8, dtype=np.float32)[[3, 5, 7]])
    cut = Outcome(tokens=(3,), claims=Claims(reuse=(), computed_steps=steps))
    assert decoded_tokens(cut) == (3, 5, 7)
    assert decoded_tokens(Outcome(tokens=(3,))) == (3,)  # no extension: the reply's own


def test_the_oracle_learns_the_tokens_a_wave_request_decoded() -> None:
    """A wave's replies go into the oracle with their decoded tokens, as a stream's do: a later
    request that continues a wave reply by its tokens (a closed loop) may reuse them. The
    negative control: the same wave added without them bounds that reuse at the prompt."""
    from pytest_prefixcache.types import Wave
    from pytest_prefixcache.verify.concurrent import _matches

    wave = Wave((FIRST,))
    cached = [Outcome(token_ids=(1, 2, 3, 4), tokens=(5,), served=0)]
    oracle = ReuseOracle(design=CacheDesign(last_kv=True))
    _matches(oracle, 0, wave, cached)
    assert oracle.match("", [1, 2, 3, 4, 5, 9], []).limit == 5
    bare = ReuseOracle(design=CacheDesign(last_kv=True))
    bare.add(0, "", [1, 2, 3, 4], [], None)
    assert bare.match("", [1, 2, 3, 4, 5, 9], []).limit == 4


# -- the probe from the tap's rows (issue #32: vllm-mlx, rapid-mlx, mlx_vlm.server) -----------
def _tapped_stub(fault: str) -> object:
    """tests/claims_stub_server.py under the tap: its replies' text is not its tokens (the next
    turn never carries the reply's ids, as tiny-llama's byte tokens on the seed engines), so
    only the model's rows can answer; ``no-last-kv`` never feeds its last token back."""
    import sys

    from pytest_prefixcache.adapters.http.openai import OpenAIEngine

    cmd = [sys.executable, str(Path(__file__).with_name("claims_stub_server.py"))]
    cmd += ["--port", "{port}"]
    return OpenAIEngine(
        [*cmd, "--fault", fault],
        cold="server",
        cold_cmd=[*cmd, "--no-cache"],
        supports_images=False,
        tap=True,
        start_timeout=60,
    )


@pytest.mark.parametrize("fault", ["", "no-last-kv"])
def test_the_tap_answers_where_the_next_turn_cannot(fault: str) -> None:
    """The stub's next turn does not carry its reply's ids: the claims alone say unknown (the
    negative control, the probe before the tap's rows). Its rows answer: one step ahead of
    the reply (mlx-lm's decode) is computed, no step ahead is not."""
    engine = _tapped_stub(fault)
    try:
        answer = last_kv_of(engine, direct)
        assert answer.computed is (fault == "")
        assert answer.how.startswith("the tap: the model's rows for a ")
        assert ("the last generated token fed back" in answer.how) is (fault == "")
        engine.kv_computed = None  # type: ignore[attr-defined,assignment]  # no rows to read
        blind = last_kv_of(engine, direct)
        assert blind.computed is None and "probe inconclusive" in blind.how
    finally:
        engine.close()  # type: ignore[attr-defined]


def test_rows_that_miss_a_step_or_are_not_a_count_answer_nothing() -> None:
    from pytest_prefixcache.errors import EngineError
    from pytest_prefixcache.verify.decode_kv import _from_rows

    first = Outcome(tokens=(5, 6), prompt_tokens=10)
    why: list[str] = []
    assert _from_rows(first, 12, why) == LastKv(
        True,
        "the tap: the model's rows for a 10-token prompt and 2 generated token(s) end at KV "
        "offset 12, the last generated token fed back",
    )
    assert _from_rows(first, 11, why).computed is False  # type: ignore[union-attr]
    assert _from_rows(first, 10, why) is None and "the tap missed decode steps" in why[-1]
    assert _from_rows(first, None, why) is None  # no observer: the next turn's reuse decides
    with pytest.raises(EngineError, match="kv_computed returned '12'"):
        _from_rows(first, "12", why)
