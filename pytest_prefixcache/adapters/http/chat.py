"""Helpers the adapters share: requests as chat messages, images as data URLs, log-softmax.

numpy and Pillow only; no engine package is imported here.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np

from ...package_data import FIXTURES
from ...types import Image, Request

__all__ = [
    "FIXTURES",
    "add_generation_prompt",
    "chat_body",
    "data_url",
    "hf_messages",
    "log_softmax",
    "openai_messages",
    "text_messages",
]


def add_generation_prompt(request: Request) -> bool:
    """A request ending in an assistant message continues it; otherwise a reply is opened."""
    return request.messages[-1].role != "assistant"


def text_messages(request: Request) -> list[dict[str, str]]:
    """The request as plain-text chat messages (text parts joined); images are not allowed."""
    return [
        {"role": m.role, "content": "".join(str(p) for p in m.content)} for m in request.messages
    ]


def hf_messages(request: Request) -> list[dict[str, Any]]:
    """The request as Hugging Face chat messages with typed parts (``{"type": "image"}``)."""
    return [
        {
            "role": m.role,
            "content": [
                {"type": "image"} if isinstance(p, Image) else {"type": "text", "text": p}
                for p in m.content
            ],
        }
        for m in request.messages
    ]


def data_url(image: Image) -> str:
    """A lossless PNG data URL of the image's pixels."""
    buf = io.BytesIO()
    image.to_pil().save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def openai_messages(request: Request) -> list[dict[str, Any]]:
    """The request as OpenAI chat messages: a string when text only, else typed parts."""
    out: list[dict[str, Any]] = []
    for m in request.messages:
        if not m.images:
            out.append({"role": m.role, "content": "".join(str(p) for p in m.content)})
            continue
        parts: list[dict[str, Any]] = [
            {"type": "image_url", "image_url": {"url": data_url(p)}}
            if isinstance(p, Image)
            else {"type": "text", "text": p}
            for p in m.content
        ]
        out.append({"role": m.role, "content": parts})
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float32 log-softmax over the last axis (float64 accumulation)."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    out = x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
    return out.astype(np.float32)


def chat_body(
    request: Request,
    *,
    top_logprobs: int,
    model: str | None = None,
    namespace: tuple[str | None, str | None, str] = (None, None, ""),
    extra: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The body and headers of a greedy ``/v1/chat/completions`` request with logprobs.

    ``namespace`` is (body field, header, value): a non-empty value goes in each one named.
    ``extra`` fields are added last, so they win over the adapter's own.
    """
    body: dict[str, Any] = {
        "messages": openai_messages(request),
        "max_tokens": max(1, request.max_new_tokens),
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": top_logprobs,
        "stream": False,
    }
    headers: dict[str, str] = {}
    field, header, value = namespace
    if value and header is not None:
        headers[header] = value
    if value and field is not None:
        body[field] = value
    if model is not None:
        body["model"] = model
    body.update(extra or {})
    return body, headers
