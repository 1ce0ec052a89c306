"""The reference engine's message starts: where each message's rendering begins in the token
ids (the boundaries the snapshot-aware reference resumes at). With the fixtures' ChatML each
one is an ``<|im_start|>``; a start the template or the tokenizer cannot tell is left out."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("mlx.core")

from pytest_prefixcache import Message, Request, make_image
from pytest_prefixcache.checks import fault_problems
from reference_engine import Engine
from reference_engine.render import _template_starts, message_starts

IMG = make_image("noise", 32, 32, seed=3)
THREE = Request(
    (
        Message("system", ("You are terse.",)),
        Message("user", ("What is in", IMG, "this picture?")),
        Message("assistant", ("A blur of colours.",)),
    )
)


@pytest.fixture(scope="module")
def engine(model: Any) -> Engine:
    return Engine(model)


def im_starts(engine: Engine, ids: tuple[int, ...]) -> list[int]:
    start = engine.model.tokenizer.convert_tokens_to_ids("<|im_start|>")
    return [i for i, t in enumerate(ids) if t == start]


@pytest.mark.parametrize("use_cache", [True, False])
def test_three_messages_start_at_their_im_start(engine: Engine, use_cache: bool) -> None:
    engine.reset()
    out = engine.run(THREE, use_cache=use_cache)
    assert out.token_ids is not None and out.message_starts is not None
    tokens = engine.model.tokenizer.convert_ids_to_tokens(
        [out.token_ids[p] for p in out.message_starts]
    )
    assert tokens == ["<|im_start|>"] * 3
    # the last message is the assistant's: no generation prompt, every <|im_start|> is a start
    assert list(out.message_starts) == im_starts(engine, out.token_ids)
    assert fault_problems(out, THREE) == []


def test_the_generation_prompt_is_not_a_message(engine: Engine) -> None:
    engine.reset()
    four = Request((*THREE.messages, Message("user", ("And now?",))))
    out = engine.run(four, use_cache=True)
    assert out.token_ids is not None and out.message_starts is not None
    assert list(out.message_starts) == im_starts(engine, out.token_ids)[:-1]
    # the growing conversation's earlier starts stay where they were
    three = engine.run(THREE, use_cache=False).message_starts
    assert out.message_starts[:3] == three


def test_a_start_the_template_does_not_keep_is_left_out() -> None:
    class Rerenders:  # renders the last message differently once more follow
        def apply_chat_template(self, chat: list[dict[str, Any]], **_: Any) -> str:
            return "".join(f"<{m['role']}>{m['content']}" for m in chat) + ("." * len(chat))

    chat = [{"role": r, "content": c} for r, c in (("system", "s"), ("user", "u"), ("user", "v"))]
    text = Rerenders().apply_chat_template(chat)
    assert _template_starts(Rerenders(), chat, text) == [0]  # no prefix render is a prefix

    class Prefixes(Rerenders):
        def apply_chat_template(self, chat: list[dict[str, Any]], **_: Any) -> str:
            return "".join(f"<{m['role']}>{m['content']}" for m in chat)

    full = Prefixes().apply_chat_template(chat)
    assert _template_starts(Prefixes(), chat, full) == [0, 9, 16]


def test_a_start_that_is_not_a_token_boundary_ends_the_list() -> None:
    def encode(texts: list[str]) -> list[tuple[int, ...]]:
        return [tuple(ord(c) for c in t) for t in texts]

    ids = tuple(ord(c) for c in "abcdef")
    assert message_starts(ids, "abcdef", [0, 2, 4], encode) == (0, 2, 4)
    merged = (ord("a"), ord("b"), 999, ord("e"), ord("f"))  # "cd" is one token
    assert message_starts(merged, "abcdef", [0, 3, 4], encode) == (0,)
    assert message_starts((), "", [0], encode) == ()


def test_the_reference_engine_declares_token_and_a_whole_blocks_subclass_block(
    model: Any,
) -> None:
    from pytest_prefixcache import CacheDesign
    from reference_engine.mutants.merge import PartialImageMerge

    # it keeps blocks of 16 but reuses to the token: its block size is no declaration; its
    # decode never computes the KV of the token it ends on (last_token_kv = False)
    assert CacheDesign.of(Engine(model)) == CacheDesign(last_kv=False)
    assert CacheDesign.of(PartialImageMerge(model, block_size=8)) == CacheDesign(
        "block", 8, last_kv=False
    )
    # on a model with non-trimmable layers (recurrent, sliding window) it resumes at snapshots
    hybrid = SimpleNamespace(model=SimpleNamespace(stateful_layers=(0, 1, 2)), partial_blocks=True)
    assert Engine.reuse_reference.fget(hybrid) == "snapshot"  # type: ignore[attr-defined]
