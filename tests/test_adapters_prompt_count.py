"""A server that answers ``usage.prompt_tokens`` 0 for a prompt that has tokens counts nothing
(vllm-mlx's MLLM text route when its system-prompt cache branch is skipped): the local render
is not judged against that 0, and its length is the count the tap looks the prompt's call up
by. Any other count is still checked against the render."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_prefixcache.adapters.http.prompt_ids import PromptIds, prompt_count
from pytest_prefixcache.adapters.http.replies import Reply
from pytest_prefixcache.errors import EngineError
from pytest_prefixcache.types import Message, Request

REQUEST = Request((Message("user", ("hello there",)),))


def reply(prompt_tokens: int | None) -> Reply:
    return Reply(steps=[], tokens=(), cached_tokens=None, prompt_tokens=prompt_tokens,
                 completion_tokens=1)  # fmt: skip


def rendered(_: Request) -> tuple[list[int], tuple[()]]:
    return [5, 6, 7, 8], ()


def test_a_zero_count_is_no_count() -> None:
    ids = PromptIds(render=rendered)
    assert ids(reply(0), REQUEST, "http://unused", 1.0) == ((5, 6, 7, 8), ())
    assert prompt_count(0, (5, 6, 7, 8)) == 4


def test_any_other_count_is_still_judged() -> None:
    ids = PromptIds(render=rendered)
    assert ids(reply(4), REQUEST, "http://unused", 1.0)[0] == (5, 6, 7, 8)
    with pytest.raises(EngineError, match=r"render has 4 prompt tokens .*prompt_tokens=3"):
        ids(reply(3), REQUEST, "http://unused", 1.0)  # negative control: a real mismatch
    assert prompt_count(3, (5, 6, 7, 8)) == 3  # never overwritten
    assert prompt_count(None, (5, 6, 7, 8)) is None  # no usage at all: the tap says so
    assert prompt_count(0, ()) == 0 and prompt_count(0, None) == 0  # nothing to count with


def test_a_reply_that_says_the_request_failed_is_a_fault_not_a_count_of_0() -> None:
    from pytest_prefixcache.adapters.http.replies import parse_reply

    def reply_ending(why: str) -> dict[str, Any]:
        return {
            "choices": [{"index": 0, "message": {"content": None}, "finish_reason": why}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }

    # vllm-mlx 0.2.9 when its MLLM batch generator raised on the request
    with pytest.raises(EngineError, match=r"finish_reason 'error' .*inside the server"):
        parse_reply(reply_ending("error"))
    assert parse_reply(reply_ending("length")).prompt_tokens == 0  # negative control
