"""Reading vLLM's ``prompt_logprobs`` from a chat completion reply.

A request with ``"prompt_logprobs": K`` gets a top-level ``prompt_logprobs`` list in the reply:
one entry per prompt position, ``null`` for the first (nothing precedes it), else an object
keyed by token id (a JSON string) whose values carry ``logprob`` (and ``rank``,
``decoded_token``): the prompt's own token and the top K there. It becomes
``Outcome.prompt_logprobs`` (:mod:`pytest_prefixcache.checks.prompt_logprobs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import EngineError

__all__ = ["read_prompt_logprobs"]


def read_prompt_logprobs(reply: Any) -> tuple[Mapping[int, float] | None, ...] | None:
    """The reply's prompt logprobs by position (token id -> logprob), or None when it has
    none; an entry of another shape raises EngineError naming the position."""
    raw = reply.get("prompt_logprobs") if isinstance(reply, dict) else None
    if raw is None:
        choices = reply.get("choices") if isinstance(reply, dict) else None
        first = choices[0] if isinstance(choices, list) and choices else None
        raw = first.get("prompt_logprobs") if isinstance(first, dict) else None
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise EngineError(f"prompt_logprobs is {type(raw).__name__}, not a list: {str(raw)[:200]}")
    out: list[Mapping[int, float] | None] = []
    for pos, entry in enumerate(raw):
        if entry is None:
            out.append(None)
            continue
        try:
            out.append(
                {
                    int(tid): float(v["logprob"] if isinstance(v, dict) else v)
                    for tid, v in entry.items()
                }
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise EngineError(
                f"prompt_logprobs position {pos}: {exc!r} in {str(entry)[:200]}"
            ) from None
    return tuple(out)
