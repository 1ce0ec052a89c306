"""The completion endpoints: for each path, how a body becomes a Request and a reply."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from pytest_prefixcache.types import Request

from . import chat, text
from .messages import build_request, prompt_request

__all__ = ["ENDPOINTS", "Endpoint"]


class Endpoint(NamedTuple):
    """How one endpoint serves a body (the reply functions take ``(out, gen, body, tokenizer,
    model)``)."""

    reply: Callable[..., dict[str, Any]]
    chunks: Callable[..., Iterable[dict[str, Any]]]
    request: Callable[[dict[str, Any], str], Request]
    check: Callable[[dict[str, Any]], object]  # the reply's own fields, before the engine runs
    template: bool  # render with the chat template


ENDPOINTS = {
    "/v1/chat/completions": Endpoint(
        chat.chat_completion, chat.chat_chunks, build_request, chat.logprobs_k, True
    ),
    "/v1/completions": Endpoint(
        text.text_completion, text.text_chunks, prompt_request, text.logprobs_k, False
    ),
}
