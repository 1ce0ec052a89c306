"""Engine Outcomes to OpenAI replies: the text of each token, ``stop``, logprobs, usage.

``generated`` turns an Outcome into what every reply shape shares: one text piece per
generated token (``""`` while a character's bytes are incomplete, and for an end-of-sequence
token), cut at the first ``stop`` string. A decoder that watches for stop strings ends at the
token that completes the first one, so the tokens after it are dropped (from the logprobs and
``completion_tokens`` too) and the text ends where that stop string starts; ``finish_reason``
is then ``"stop"``, as after an end-of-sequence token, else ``"length"``. Streamed chunks
carry the same pieces, so their concatenation is the non-streamed content.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytest_prefixcache.types import Outcome

__all__ = [
    "Generated",
    "chat_logprobs",
    "extension",
    "extension_field",
    "generated",
    "log_softmax",
    "reply_id",
    "text_logprobs",
    "usage",
]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float32 log-softmax over the last axis (float64 accumulation), as the plugin's adapters
    compute it from a server's logits."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))).astype(np.float32)


@dataclass(frozen=True)
class Generated:
    """The generated tokens kept, the text piece of each, and why generation ended."""

    tokens: tuple[int, ...]
    pieces: tuple[str, ...]
    finish_reason: str
    logprobs: tuple[np.ndarray, ...]

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def _pieces(tokens: Sequence[int], tokenizer: Any, eos: frozenset[int]) -> list[str]:
    """One text piece per token whose concatenation is the decoded text (the offsets
    technique of incremental detokenisers: decode from a recent boundary, emit only complete
    characters)."""
    text_tokens = [t for t in tokens if t not in eos]
    pieces: list[str] = []
    prefix = read = 0
    for i in range(len(text_tokens)):
        before = tokenizer.decode(text_tokens[prefix:read])
        after = tokenizer.decode(text_tokens[prefix : i + 1])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            pieces.append(after[len(before) :])
            prefix, read = read, i + 1
        else:
            pieces.append("")
    whole, joined = tokenizer.decode(text_tokens), "".join(pieces)
    if pieces and whole.startswith(joined):
        pieces[-1] += whole[len(joined) :]
    return pieces + [""] * (len(tokens) - len(text_tokens))


def generated(
    out: Outcome, tokenizer: Any, eos: frozenset[int], stop: Sequence[str] = ()
) -> Generated:
    """What the engine generated for a reply, cut at the first of ``stop`` (module doc)."""
    tokens = tuple(int(t) for t in out.tokens)
    pieces = _pieces(tokens, tokenizer, eos)
    finish = "stop" if tokens and tokens[-1] in eos else "length"
    text = "".join(pieces)
    found = [(text.find(s) + len(s), text.find(s)) for s in stop if s in text]
    if found:
        end, start = min(found)
        total = keep = 0
        while total < end:
            total += len(pieces[keep])
            keep += 1
        cut, used = [], 0
        for piece in pieces[:keep]:
            cut.append(piece[: max(0, start - used)])
            used += len(cut[-1])
        tokens, pieces, finish = tokens[:keep], cut, "stop"
    logprobs = tuple(log_softmax(x) for x in out.step_logits[: len(tokens)])
    return Generated(tokens, tuple(pieces), finish, logprobs)


def _top(logprobs: np.ndarray, k: int, tokenizer: Any) -> list[dict[str, Any]]:
    order = np.argsort(-logprobs, kind="stable")[:k]
    return [
        {"token": tokenizer.decode([int(i)]), "id": int(i), "logprob": float(logprobs[i])}
        for i in order
    ]


def chat_logprobs(gen: Generated, k: int, tokenizer: Any) -> list[dict[str, Any]]:
    """``logprobs.content`` entries, one per token (each with its ``id`` and
    ``top_logprobs`` sorted by logprob)."""
    return [
        {
            "token": tokenizer.decode([token]),
            "id": token,
            "logprob": float(lp[token]),
            "bytes": None,
            "top_logprobs": _top(lp, k, tokenizer),
        }
        for token, lp in zip(gen.tokens, gen.logprobs)
    ]


def text_logprobs(gen: Generated, k: int, tokenizer: Any) -> dict[str, list[Any]]:
    """The legacy ``/v1/completions`` logprobs object (a list per field, one item a token)."""
    offsets = np.cumsum([0, *(len(p) for p in gen.pieces)])
    return {
        "tokens": [tokenizer.decode([t]) for t in gen.tokens],
        "token_logprobs": [float(lp[t]) for t, lp in zip(gen.tokens, gen.logprobs)],
        "top_logprobs": [
            {e["token"]: e["logprob"] for e in _top(lp, k, tokenizer)} for lp in gen.logprobs
        ],
        "text_offset": [int(o) for o in offsets[: len(gen.tokens)]],
    }


def usage(out: Outcome, gen: Generated) -> dict[str, Any]:
    """The ``usage`` object: prompt, completion and cached prompt tokens."""
    n_prompt = out.prompt_tokens or 0
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": len(gen.tokens),
        "total_tokens": n_prompt + len(gen.tokens),
        "prompt_tokens_details": {"cached_tokens": out.cached_tokens or 0},
    }


def reply_id(kind: str) -> tuple[str, int]:
    """A fresh reply id (``chatcmpl-...`` or ``cmpl-...``) and the creation time."""
    return f"{kind}-{uuid.uuid4().hex[:24]}", int(time.time())


def extension_field(out: Outcome, body: dict[str, Any]) -> dict[str, Any]:
    """``{"prefixcache": ...}`` when the body asks for the extension, else ``{}``."""
    ext = body.get("prefixcache")
    if not isinstance(ext, dict):
        return {}
    return {"prefixcache": extension(out, logits=bool(ext.get("logits")))}


def extension(out: Outcome, *, logits: bool) -> dict[str, Any]:
    """What only this server tells (asked for by ``"prefixcache": {"logits": true}`` in the
    body): prompt token ids, image spans, vision merges, message starts, the time to first
    token and, with ``logits``, the float32 logits before each generated token as base64."""
    ext: dict[str, Any] = {
        "token_ids": list(out.token_ids or ()),
        "image_spans": [list(s) for s in out.image_spans or ()],
        "merges": [list(m) for m in out.merges or ()],
    }
    if out.message_starts is not None:
        ext["message_starts"] = list(out.message_starts)
    if out.served is not None:  # the engine's admission order among requests in flight
        ext["served"] = out.served
    if out.first_token_seconds is not None:  # what --prefixcache-min-speedup judges
        ext["first_token_seconds"] = out.first_token_seconds
    if logits:
        ext["step_logits"] = [
            base64.b64encode(np.asarray(x, dtype=np.float32).tobytes()).decode("ascii")
            for x in out.step_logits
        ]
    return ext
