"""The request fields that are not messages: what is implemented, what is refused.

The engine decodes greedily. A sampling field is accepted only with a value that leaves a
greedy decode unchanged (``GREEDY``: ``temperature`` 0, ``top_p`` 1, ``n`` 1, penalties 0, ...)
and refused otherwise with HTTP 400 naming the field and the value; it is never ignored.
``seed`` is accepted whatever its value: a greedy decode is the same under every seed.
``stop`` is implemented (``Stop``); ``tools``, a ``tool_choice`` that forces a call, a
``response_format`` other than text, ``logit_bias``, ``echo`` and ``suffix`` are refused.
"""

from __future__ import annotations

from typing import Any

from .errors import APIError

__all__ = ["GREEDY", "MAX_STOP", "check_sampling", "int_field", "stop_strings", "stream_usage"]

#: Sampling fields and the values that mean a greedy decode (None, i.e. absent, always does).
GREEDY: dict[str, tuple[float, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "temperature": (0,),
    "top_p": (1,),
    "top_k": (-1, 0, 1),
    "min_p": (0,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "repetition_penalty": (1,),
}
#: Stop strings per request, at most (OpenAI's limit).
MAX_STOP = 4


def _refuse(name: str, value: Any, why: str) -> APIError:
    return APIError(
        f"{name}={value!r} is not supported: {why}", param=name, code="unsupported_value"
    )


def check_sampling(body: dict[str, Any]) -> None:
    """Raise APIError for the first field whose value this server cannot honour."""
    for name, allowed in GREEDY.items():
        value = body.get(name)
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or value not in allowed:
            shown = " or ".join(repr(a) for a in allowed)
            raise _refuse(name, value, f"this server decodes greedily ({name} must be {shown})")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise APIError(f"seed must be an integer, got {seed!r}", param="seed")
    if body.get("logit_bias"):
        raise _refuse("logit_bias", body["logit_bias"], "this server decodes greedily")
    tools = body.get("tools")
    if tools:
        if isinstance(tools, list):
            tools = [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)]
        raise _refuse(
            "tools",
            tools,
            "replies are never parsed into tool calls (earlier tool calls and tool results in "
            "'messages' are rendered)",
        )
    if body.get("tool_choice") not in (None, "none", "auto"):
        raise _refuse("tool_choice", body["tool_choice"], "no tools can be called")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise _refuse("response_format", fmt, "only {'type': 'text'} is")
    for name in ("echo", "suffix", "audio"):
        if body.get(name):
            raise _refuse(name, body[name], "this server does not implement it")


def int_field(body: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    """The integer field ``name`` (``default`` when absent), checked to lie in [low, high]."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise APIError(f"{name} must be an integer in [{low}, {high}], got {value!r}", param=name)
    return value


def stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    """The ``stop`` field as a tuple of non-empty strings (at most ``MAX_STOP``)."""
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOP
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise APIError(
            f"stop must be a non-empty string or a list of at most {MAX_STOP}, got {stop!r}",
            param="stop",
        )
    return tuple(stops)


def stream_usage(body: dict[str, Any]) -> bool:
    """Whether the body asks for streaming usage (``stream_options.include_usage``)."""
    stream, options = body.get("stream"), body.get("stream_options")
    if stream is not None and not isinstance(stream, bool):
        raise APIError(f"stream must be a boolean, got {stream!r}", param="stream")
    if options is None:
        return False
    if not stream:
        raise APIError("stream_options is only allowed with stream=true", param="stream_options")
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise APIError(
            f"stream_options must be {{'include_usage': bool}}, got {options!r}",
            param="stream_options",
        )
    return bool(options.get("include_usage"))
