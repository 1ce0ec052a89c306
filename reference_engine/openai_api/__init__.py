"""The OpenAI API of the reference server: request bodies to engine Requests
(``messages``), the fields it honours or refuses (``params``), replies (``replies``,
``chat``, ``text``), the endpoints that tie them together (``endpoints``) and errors in the
OpenAI shape (``errors``). The HTTP side is ``reference_engine.server``.
"""

from __future__ import annotations

from .chat import MAX_TOP_LOGPROBS, chat_chunks, chat_completion
from .endpoints import ENDPOINTS, Endpoint
from .errors import APIError
from .messages import DEFAULT_MAX_TOKENS, build_request, prompt_request
from .params import GREEDY, check_sampling, stop_strings, stream_usage
from .replies import Generated, extension, generated
from .text import MAX_LOGPROBS, text_chunks, text_completion

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "ENDPOINTS",
    "GREEDY",
    "MAX_LOGPROBS",
    "MAX_TOP_LOGPROBS",
    "APIError",
    "Endpoint",
    "Generated",
    "build_request",
    "chat_chunks",
    "chat_completion",
    "check_sampling",
    "extension",
    "generated",
    "prompt_request",
    "stop_strings",
    "stream_usage",
    "text_chunks",
    "text_completion",
]
