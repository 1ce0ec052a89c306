"""``/v1/chat/completions`` replies: one ``chat.completion``, or its ``chat.completion.chunk``
stream.

A stream is the finished reply cut into chunks (the engine decodes a whole request before it
answers): a first chunk with the role, one chunk per generated token with its text piece and,
when asked, its logprobs entry, a chunk with ``finish_reason`` (and the ``prefixcache``
extension when asked), and, with ``stream_options.include_usage``, a last chunk with empty
``choices`` and the ``usage`` (every other chunk then has ``"usage": null``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pytest_prefixcache.types import Outcome

from .errors import APIError
from .params import int_field, stream_usage
from .replies import Generated, chat_logprobs, extension_field, reply_id, usage

__all__ = ["MAX_TOP_LOGPROBS", "chat_chunks", "chat_completion", "logprobs_k"]

#: ``top_logprobs`` at most (OpenAI's limit).
MAX_TOP_LOGPROBS = 20


def logprobs_k(body: dict[str, Any]) -> int | None:
    """k of ``top_logprobs`` when ``logprobs`` is asked for, else None; raises APIError for
    a bad ``top_logprobs``."""
    k = int_field(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if k and not body.get("logprobs"):
        raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")
    return k if body.get("logprobs") else None


def chat_completion(
    out: Outcome, gen: Generated, body: dict[str, Any], tokenizer: Any, model: str
) -> dict[str, Any]:
    """The ``chat.completion`` reply."""
    k = logprobs_k(body)
    rid, created = reply_id("chatcmpl")
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": gen.text},
                "finish_reason": gen.finish_reason,
                "logprobs": None
                if k is None
                else {"content": chat_logprobs(gen, k, tokenizer), "refusal": None},
            }
        ],
        "usage": usage(out, gen),
        **extension_field(out, body),
    }


def chat_chunks(
    out: Outcome, gen: Generated, body: dict[str, Any], tokenizer: Any, model: str
) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed reply, in order."""
    k = logprobs_k(body)
    with_usage = stream_usage(body)
    rid, created = reply_id("chatcmpl")
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    tail = {"usage": None} if with_usage else {}

    def chunk(delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> Any:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {**head, "choices": [choice], **tail}

    entries = [] if k is None else chat_logprobs(gen, k, tokenizer)
    yield chunk({"role": "assistant", "content": ""})
    for i, piece in enumerate(gen.pieces):
        yield chunk({"content": piece}, None if k is None else {"content": entries[i : i + 1]})
    yield {**chunk({}, None, gen.finish_reason), **extension_field(out, body)}
    if with_usage:
        yield {**head, "choices": [], "usage": usage(out, gen)}
