"""The reference engine's two cache designs: ``prompt`` (the default: the prompt's KV only)
and ``prompt+output`` (``cache_output=True``, ``PREFIXCACHE_REFERENCE_CACHE``: the KV the
decode computed is stored under the prompt + output tokens), and the
``output_kv_off_by_one`` mutant that breaks the second."""

from __future__ import annotations

from typing import Any

import pytest

mx = pytest.importorskip("mlx.core")

from pytest_prefixcache import Message, Request, VerificationFailure, Verifier  # noqa: E402
from pytest_prefixcache.errors import EngineError  # noqa: E402
from pytest_prefixcache.types import ReplyOf  # noqa: E402
from reference_engine import Engine  # noqa: E402
from reference_engine.engine import CACHE_ENV, cache_output_from_env  # noqa: E402
from reference_engine.model import LoadedModel  # noqa: E402
from reference_engine.mutants import MUTANTS  # noqa: E402

SYSTEM = Message(
    "system",
    ("You are a careful visual assistant. Look at every image the user sends and describe it.",),
)
FIRST = Request((SYSTEM, Message("user", ("describe the image, thanks",))), "", 8)


def turn(base: Request, index: int, text: str) -> Request:
    msgs = (*base.messages, Message("assistant", (ReplyOf(index),)), Message("user", (text,)))
    return Request(msgs, base.namespace, 8)


def conversation() -> list[Request]:
    out = [FIRST]
    for i, text in enumerate(("and now", "compare them", "thanks")):
        out.append(turn(out[-1], i, text))
    return out


def test_the_design_is_a_setting(model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Engine(model).caches_output is False
    assert Engine(model, cache_output=True).caches_output is True
    monkeypatch.setenv(CACHE_ENV, "prompt+output")
    assert cache_output_from_env() and Engine(model).caches_output is True
    assert Engine(model, cache_output=False).caches_output is False
    monkeypatch.setenv(CACHE_ENV, "prompt")
    assert Engine(model).caches_output is False
    monkeypatch.setenv(CACHE_ENV, "both")
    with pytest.raises(EngineError, match=r"PREFIXCACHE_REFERENCE_CACHE='both' is not one of"):
        Engine(model)


def test_the_reply_text_is_the_tokens_decoded(model: LoadedModel) -> None:
    out = Engine(model).run(FIRST, use_cache=True)
    assert len(out.tokens) == 8
    assert out.text == model.tokenizer.decode(list(out.tokens), skip_special_tokens=True)


@pytest.mark.parametrize("outputs", [False, True], ids=["prompt", "prompt+output"])
def test_each_design_is_bit_exact_and_judged_by_its_own_reference(
    model: LoadedModel, outputs: bool
) -> None:
    """Closed-loop turns: prompt+output reuses past the previous prompt (decode-time KV, up
    to where the re-tokenised reply differs), prompt-only stops at it; both are exact and
    reuse all their own reference allows."""
    v = Verifier(Engine(model, cache_output=outputs))
    steps = v.run(conversation())
    assert all(s.match is not None and s.match.decode_start is not None for s in steps[1:])
    # the first closed-loop turn: only request 0's prefill and decode came before it
    prompt0 = len(steps[0].cached.token_ids or ())
    assert ((steps[1].cached.cached_tokens or 0) > prompt0) is outputs
    for s in steps:
        assert s.comparison.worst_diff == 0.0
        assert s.match is not None and s.cached.cached_tokens == s.match.max_reuse
    assert v.report.coverage["closed loop"] == {"applied": 3}


def test_reuse_stops_where_the_next_prompt_leaves_the_output(model: LoadedModel) -> None:
    """Another assistant text than the reply: nothing past the previous prompt is reused."""
    engine = Engine(model, cache_output=True)
    first = engine.run(FIRST, use_cache=True)
    other = "".join(reversed(first.text or "x")) + " not the reply"
    nxt = Request(
        (*FIRST.messages, Message("assistant", (other,)), Message("user", ("and now",))), "", 2
    )
    out = engine.run(nxt, use_cache=True)
    assert out.cached_tokens is not None and out.cached_tokens <= len(first.token_ids or ())


def test_the_mutant_moves_the_next_turns_logits(model: LoadedModel) -> None:
    stream = conversation()[:2]
    with pytest.raises(VerificationFailure, match="equivalence"):
        Verifier(MUTANTS["output_kv_off_by_one"].build(model)).run(stream)
    Verifier(Engine(model, **MUTANTS["output_kv_off_by_one"].options)).run(stream)


def test_open_loop_streams_never_reach_the_mutants_rows(model: Any) -> None:
    """Negative control of the closed loop: the same turns with text the strategy wrote pass
    on the mutant (so only a closed-loop stream catches it)."""
    msgs = (*FIRST.messages, Message("assistant", ("A square.",)), Message("user", ("why",)))
    Verifier(MUTANTS["output_kv_off_by_one"].build(model)).run([FIRST, Request(msgs, "", 8)])
