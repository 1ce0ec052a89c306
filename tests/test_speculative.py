"""The reference engine's speculative mode (``reference_engine/speculative.py``), its draft
fixtures (``reference_engine/fixtures/draft.py``) and the class-26 mutant
``rejected_draft_kept``: speculation changes nothing the verifier sees, cold or cached, and
stores no rejected draft's KV; the mutant, which keeps the last round's rejected rows, is caught
by the closed loop's next turn, and the same stream passes without the bug."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from pytest_prefixcache import Message, Request, VerificationFailure, Verifier  # noqa: E402
from pytest_prefixcache.errors import EngineError  # noqa: E402
from pytest_prefixcache.output.streams import load_stream  # noqa: E402
from pytest_prefixcache.types import Image, ReplyOf  # noqa: E402
from reference_engine import Engine  # noqa: E402
from reference_engine.fixtures.draft import DRAFTS, build_draft, draft_dir  # noqa: E402
from reference_engine.model import LoadedModel  # noqa: E402
from reference_engine.mutants import MUTANTS  # noqa: E402
from reference_engine.mutants.speculation import draft_for  # noqa: E402
from reference_engine.speculative import (  # noqa: E402
    DRAFT_ENV,
    DRAFT_TOKENS_ENV,
    Speculative,
    speculative_from_env,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
COUNTEREXAMPLE = FIXTURES / "corpus" / "mutants" / "mutant_rejected_draft_kept.json"
IMAGE = Image(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
FIRST = Request((Message("user", ("describe", IMAGE, "the picture please")),), "", 12)


def conversation(turns: int = 3) -> list[Request]:
    out = [FIRST]
    for i in range(turns - 1):
        msgs = (*out[-1].messages, Message("assistant", (ReplyOf(i),)), Message("user", ("more",)))
        out.append(Request(msgs, "", 12))
    return out


@pytest.fixture(scope="module")
def spec(model: LoadedModel) -> Speculative:
    return draft_for(model)


@pytest.mark.parametrize("target", sorted(DRAFTS))
def test_each_draft_is_its_target_cut_short_and_rebuilds_byte_for_byte(
    target: str, tmp_path: Path
) -> None:
    shipped = FIXTURES / draft_dir(target)
    t = json.loads((FIXTURES / target / "config.json").read_text())
    d = json.loads((shipped / "config.json").read_text())
    layers = lambda c: c.get("text_config", c)["num_hidden_layers"]  # noqa: E731
    assert layers(d) == DRAFTS[target] < layers(t)
    assert (shipped / "tokenizer.json").read_bytes() == (
        FIXTURES / target / "tokenizer.json"
    ).read_bytes()
    assert sum(f.stat().st_size for f in shipped.iterdir()) < 1_000_000
    (tmp_path / target).symlink_to(FIXTURES / target)
    rebuilt = build_draft(tmp_path, target)
    for f in shipped.iterdir():
        assert (rebuilt / f.name).read_bytes() == f.read_bytes(), f.name


def test_speculation_changes_nothing_and_both_accepts_and_rejects(
    model: LoadedModel, spec: Speculative
) -> None:
    """Speculative runs (a turn and its exact repeat) give the tokens and every step's logits
    of the plain cold run, bit for bit (Qwen2-VL: a verification forward and one-token steps
    agree), and each turn reuses exactly what it reuses after a plain decode."""
    plain, fast = (
        Engine(model, cache_output=True),
        Engine(model, cache_output=True, speculative=spec),
    )
    before = (spec.accepted, spec.rejected)
    reply = ""
    for request in conversation():
        msgs = request.messages
        if len(msgs) > 1:  # the closed loop by hand: the plain cold reply
            msgs = (*msgs[:-2], Message("assistant", (reply,)), msgs[-1])
        r = Request(msgs, "", request.max_new_tokens)
        cold = plain.run(r, use_cache=False)
        warm_plain = plain.run(r)
        outs = (fast.run(r), fast.run(r))  # the turn, then its exact repeat
        for out in outs:
            assert out.speculated and out.tokens == cold.tokens
            assert all(np.array_equal(a, b) for a, b in zip(out.step_logits, cold.step_logits))
        assert outs[0].cached_tokens == warm_plain.cached_tokens
        reply = cold.text or ""
    assert spec.accepted > before[0] and spec.rejected > before[1]


def test_the_verifier_passes_speculation_and_catches_the_kept_rejected_draft(
    model: LoadedModel, spec: Speculative
) -> None:
    """The mutant's shrunk counterexample (a 2-token reply whose last round rejected its
    draft) fails on the mutant and passes on the speculative engine without the bug."""
    stream, _ = load_stream(COUNTEREXAMPLE)
    assert len(stream) == 2 and stream[1].messages[-2].role == "assistant"
    Verifier(Engine(model, cache_output=True, speculative=spec)).run(stream)
    Verifier(Engine(model, cache_output=True, speculative=spec)).run(conversation())
    with pytest.raises(VerificationFailure, match="equivalence"):
        Verifier(MUTANTS["rejected_draft_kept"].build(model)).run(stream)


def test_the_mutant_stores_the_rejected_row_and_the_engine_does_not(
    model: LoadedModel, spec: Speculative
) -> None:
    """On the counterexample's two turns: the speculative engine's next turn reuses what the
    plain engine's does, with the same logits; the mutant's reuses one row more (the rejected
    draft's, under the reply's last token) and its logits move."""
    stream, _ = load_stream(COUNTEREXAMPLE)
    seen: dict[str, tuple[Any, Any]] = {}
    for name, engine in (
        ("plain", Engine(model, cache_output=True)),
        ("spec", Engine(model, cache_output=True, speculative=spec)),
        ("mutant", MUTANTS["rejected_draft_kept"].build(model)),
    ):
        out = engine.run(stream[0])
        assert out.text == "S picture"  # the reply the second turn carries
        seen[name] = (out, engine.run(stream[1]))
    plain, fast, mutant = (seen[k][1] for k in ("plain", "spec", "mutant"))
    assert fast.cached_tokens == plain.cached_tokens
    assert np.array_equal(fast.logits, plain.logits)
    assert mutant.cached_tokens == plain.cached_tokens + 1
    assert not np.array_equal(mutant.logits, plain.logits)


def test_bad_settings_are_named(
    model: LoadedModel, models: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DRAFT_ENV, str(FIXTURES / draft_dir("tiny-qwen2-vl")))
    monkeypatch.setenv(DRAFT_TOKENS_ENV, "many")
    with pytest.raises(
        EngineError, match=r"PREFIXCACHE_REFERENCE_DRAFT_TOKENS='many' is not an int"
    ):
        speculative_from_env(model)
    monkeypatch.setenv(DRAFT_TOKENS_ENV, "0")
    with pytest.raises(EngineError, match="must be at least 1"):
        speculative_from_env(model)
    monkeypatch.setenv(DRAFT_TOKENS_ENV, "2")
    engine = Engine(model)
    assert engine.speculative is not None and engine.speculative.num_draft == 2
    monkeypatch.delenv(DRAFT_ENV)
    assert Engine(model).speculative is None
    with pytest.raises(EngineError, match="num_draft must be a positive int"):
        Speculative(model, 0)
    with pytest.raises(EngineError, match="has a tokenizer of 400 tokens"):
        Engine(model, speculative=Speculative(models("tiny-gemma3"), 2))
    with pytest.raises(EngineError, match="has 2 sliding-window layers"):
        Engine(models("tiny-gemma3"), speculative=Speculative(model, 2))


class _KeepsOneRejectedRow(Engine):
    """Negative control: every round but the last keeps one row too many (a rejected draft's
    KV, or the accepted ones shifted), so later verifications attend to it."""

    def rewind(self, cache: list[Any], rows: int, *, last: bool) -> None:
        super().rewind(cache, rows + (0 if last else 1), last=last)


def test_a_rewind_that_keeps_a_row_changes_what_the_verifier_sees(
    model: LoadedModel, spec: Speculative
) -> None:
    """The uncached run decodes plainly, so equivalence compares the speculative decode with
    greedy decoding: it catches a mid-decode rewind bug that a speculative cold run would
    share (both sides equal), and passes the engine without it."""
    r = Request(FIRST.messages, "", 16)
    broken = _KeepsOneRejectedRow(model, speculative=spec)
    with pytest.raises(VerificationFailure, match="equivalence"):
        Verifier(broken).run([r])
    out = broken.run(r)
    assert out.speculated and not broken.run(r, use_cache=False).speculated
    v = Verifier(Engine(model, speculative=spec))
    v.run([r])
    assert v.report.coverage["speculation"] == {"applied": 1}
    v = Verifier(Engine(model))
    v.run([r])
    assert "speculation" not in v.report.coverage


@pytest.mark.slow  # about 10 s: the hybrid's fixture, target and draft
def test_on_a_hybrid_the_recurrent_state_is_rolled_back(models: Any) -> None:
    """tiny-qwen3.5-vl (GatedDeltaNet x3 + attention, twice) with its 4-layer draft: after a
    rejection the recurrent states return to before the verification and the kept tokens run
    again, so the speculative decode equals plain greedy decoding bit for bit; the mutant that
    keeps the advanced states does not, and the verifier says so."""
    target = models("tiny-qwen3.5-vl")
    spec = draft_for(target)
    r = Request((Message("user", ("describe the picture please, and more",)),), "", 16)
    cold = Engine(target).run(r, use_cache=False)
    out = Engine(target, speculative=spec).run(r)
    assert spec.rejected > 0 and out.speculated and out.tokens == cold.tokens
    assert all(np.array_equal(a, b) for a, b in zip(out.step_logits, cold.step_logits))
    Verifier(Engine(target, speculative=spec)).run([r, r])
    mutant = MUTANTS["recurrent_not_rolled_back"].build(target)
    assert mutant.run(r, use_cache=False).tokens == cold.tokens  # its cold run is plain
    with pytest.raises(VerificationFailure, match="equivalence"):
        Verifier(MUTANTS["recurrent_not_rolled_back"].build(target)).run([r])


def test_the_mlx_lm_preset_speculates_against_a_cold_server_without_the_draft() -> None:
    from pytest_prefixcache.adapters.presets import mlx_lm_server

    e = mlx_lm_server(draft_model="tiny-llama-draft", num_draft_tokens=2, tap=False)
    cmd = e.server.cmd  # type: ignore[union-attr]
    draft = str(FIXTURES / "tiny-llama-draft")
    assert cmd[-4:] == ["--draft-model", draft, "--num-draft-tokens", "2"]
    assert "--draft-model" not in e.cold_server.cmd  # type: ignore[union-attr]
    assert "--draft-model" not in mlx_lm_server(tap=False).server.cmd  # type: ignore[union-attr]
    with pytest.raises(EngineError, match="'tiny-nothing' is not a fixture model"):
        mlx_lm_server(draft_model="tiny-nothing")
