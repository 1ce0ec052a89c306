"""``/v1/completions`` replies: one ``text_completion``, or its stream of
``text_completion`` chunks (one per generated token, then one with ``finish_reason``, then,
with ``stream_options.include_usage``, one with empty ``choices`` and the ``usage``).
``logprobs`` is the legacy integer k (at most 5) and its reply the legacy object (``tokens``,
``token_logprobs``, ``top_logprobs``, ``text_offset``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pytest_prefixcache.types import Outcome

from .errors import APIError
from .params import stream_usage
from .replies import Generated, extension_field, reply_id, text_logprobs, usage

__all__ = ["MAX_LOGPROBS", "logprobs_k", "text_chunks", "text_completion"]

#: ``logprobs`` at most (OpenAI's limit for ``/v1/completions``).
MAX_LOGPROBS = 5


def logprobs_k(body: dict[str, Any]) -> int | None:
    """k of the legacy integer ``logprobs``, or None; raises APIError for a bad one."""
    k = body.get("logprobs")
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_LOGPROBS:
        raise APIError(
            f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {k!r}", param="logprobs"
        )
    return k


def text_completion(
    out: Outcome, gen: Generated, body: dict[str, Any], tokenizer: Any, model: str
) -> dict[str, Any]:
    """The ``text_completion`` reply."""
    k = logprobs_k(body)
    rid, created = reply_id("cmpl")
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": gen.text,
                "finish_reason": gen.finish_reason,
                "logprobs": None if k is None else text_logprobs(gen, k, tokenizer),
            }
        ],
        "usage": usage(out, gen),
        **extension_field(out, body),
    }


def text_chunks(
    out: Outcome, gen: Generated, body: dict[str, Any], tokenizer: Any, model: str
) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed ``/v1/completions`` reply, in order."""
    k = logprobs_k(body)
    with_usage = stream_usage(body)
    rid, created = reply_id("cmpl")
    head = {"id": rid, "object": "text_completion", "created": created, "model": model}
    tail = {"usage": None} if with_usage else {}
    lp = None if k is None else text_logprobs(gen, k, tokenizer)
    for i, piece in enumerate(gen.pieces):
        step = None if lp is None else {key: value[i : i + 1] for key, value in lp.items()}
        choice = {"index": 0, "text": piece, "logprobs": step, "finish_reason": None}
        yield {**head, "choices": [choice], **tail}
    choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": gen.finish_reason}
    yield {**head, "choices": [choice], **tail}
    if with_usage:
        yield {**head, "choices": [], "usage": usage(out, gen)}
