"""OpenAI request bodies to engine Requests.

Chat ``messages`` become ``Message``s with text and image parts; images must be data URLs.
Roles, as the model's chat template sees them:

- ``system``, ``user``, ``assistant`` as they are; ``developer`` is a ``system`` message.
- An assistant message's ``tool_calls`` are rendered as text after its content, one block
  per call, in the Qwen2.5 (Hermes) format the fixture's template cannot render itself:
  ``<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>``, blocks joined by a
  newline, ``ARGS`` the parsed JSON of ``function.arguments`` (the string itself when it is
  not JSON), dumped with ``json.dumps(ensure_ascii=False)``. ``id`` and ``type`` are not
  rendered.
- ``tool`` messages (results) become one ``user`` message per run of consecutive results,
  each ``<tool_response>\\n{content}\\n</tool_response>``, joined by a newline, as Qwen2.5's
  template renders them. ``tool_call_id`` is not rendered.

``/v1/completions`` takes ``prompt`` (a string, or a list holding one) as the exact prompt
text, without the chat template; added tokens in it (``<|im_start|>``) are tokenised as such.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from pytest_prefixcache.errors import PrefixCacheError
from pytest_prefixcache.types import Image, Message, Part, Request

from .errors import APIError
from .params import int_field

__all__ = ["DEFAULT_MAX_TOKENS", "build_request", "prompt_request", "tool_call_text"]

#: ``max_tokens`` when a request gives none.
DEFAULT_MAX_TOKENS = 16
_MAX_TOKENS_LIMIT = 1 << 20
_ROLES = ("system", "developer", "user", "assistant", "tool")


def _image(url: Any, where: str) -> Image:
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str) or not url.startswith("data:") or "," not in url:
        raise APIError(
            f"{where}: images must be data URLs (data:image/png;base64,...)", param=where
        )
    try:
        return Image.open(base64.b64decode(url.partition(",")[2], validate=True))
    except (ValueError, PrefixCacheError) as exc:
        raise APIError(f"{where}: bad image data URL: {exc}", param=where) from None


def _parts(content: Any, where: str, *, images: bool = True) -> tuple[Part, ...]:
    if content is None:
        return ()
    if isinstance(content, str):
        return (content,)
    if not isinstance(content, list):
        raise APIError(
            f"{where} must be a string or a list of parts, got {content!r:.80}", param=where
        )
    parts: list[Part] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif images and kind in ("image_url", "input_image", "image"):
            parts.append(_image(part.get("image_url", part.get("image")), f"{where}[{j}]"))
        else:
            raise APIError(
                f"{where}[{j}]: unsupported content part {part!r:.80}", param=f"{where}[{j}]"
            )
    return tuple(parts)


def tool_call_text(call: Any, where: str) -> str:
    """One tool call as the text block the prompt gets (see the module docstring)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise APIError(
            f"{where} must be {{'type': 'function', 'function': {{'name', "
            f"'arguments'}}}}, got {call!r:.80}",
            param=where,
        )
    args = fn.get("arguments", "{}")
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        pass  # not JSON: rendered as the string it is
    call_json = json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{call_json}\n</tool_call>"


def _messages(raw: Any) -> tuple[Message, ...]:
    if not isinstance(raw, list) or not raw:
        raise APIError("messages must be a non-empty list", param="messages")
    out: list[Message] = []
    results: list[str] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in _ROLES:
            raise APIError(
                f"{where}.role is {role!r}, not one of {', '.join(_ROLES)}", param=f"{where}.role"
            )
        if role == "tool":
            parts = _parts(m.get("content"), f"{where}.content", images=False)
            text = "".join(p for p in parts if isinstance(p, str))
            results.append(f"<tool_response>\n{text}\n</tool_response>")
            continue
        if results:
            out.append(Message("user", ("\n".join(results),)))
            results = []
        parts = _parts(m.get("content"), f"{where}.content")
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls:
            if not isinstance(calls, list):
                raise APIError(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
            blocks = "\n".join(
                tool_call_text(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)
            )
            parts = (*parts, "\n" + blocks) if parts else (blocks,)
        out.append(Message("system" if role == "developer" else role, parts))
    if results:
        out.append(Message("user", ("\n".join(results),)))
    return tuple(out)


def _request(messages: tuple[Message, ...], body: dict[str, Any], namespace: str) -> Request:
    max_tokens = int_field(body, "max_completion_tokens", -1, 0, _MAX_TOKENS_LIMIT)
    if max_tokens < 0:
        max_tokens = int_field(body, "max_tokens", DEFAULT_MAX_TOKENS, 0, _MAX_TOKENS_LIMIT)
    try:
        return Request(
            messages,
            namespace=str(body.get("namespace", body.get("cache_salt", namespace))),
            max_new_tokens=max_tokens,
        )
    except PrefixCacheError as exc:
        raise APIError(str(exc)) from None


def build_request(body: dict[str, Any], namespace: str = "") -> Request:
    """The engine Request for an OpenAI chat completion body."""
    return _request(_messages(body.get("messages")), body, namespace)


def prompt_request(body: dict[str, Any], namespace: str = "") -> Request:
    """The engine Request for a ``/v1/completions`` body: its ``prompt`` as one text part
    (to be run with ``Engine.run(..., template=False)``)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise APIError(
            f"prompt must be a non-empty string (or a list holding one), got {prompt!r:.80}",
            param="prompt",
        )
    return _request((Message("user", (prompt,)),), body, namespace)
