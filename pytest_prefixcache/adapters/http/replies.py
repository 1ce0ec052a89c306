"""Reading OpenAI chat completion replies: top_logprobs by token id, usage figures, and the
server's own token ids.

A top_logprobs entry names its token in one of the forms servers use: an ``id`` (llama-server,
the reference server), a ``token_id:N`` string (vLLM with ``return_tokens_as_token_ids``), or
text that a :class:`Vocabulary` looks up (``token``, else the UTF-8 ``bytes``; SGLang: the
token's raw ``bytes``, ``kind="bytes"``). Sorting is done
here: never trust a step's own ``id``/``token`` label blindly (mlx-lm 0.32.2 reports the first
element of an unsorted top-k there); :func:`logprob_problems` checks it when asked.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import EngineError
from ...types import Outcome

__all__ = [
    "Reply",
    "Vocabulary",
    "byte_decoder",
    "logprob_problems",
    "parse_reply",
    "stopped_unreported",
    "token_id",
    "with_extension",
]

TOKEN_ID_PREFIX = "token_id:"


KINDS = ("decoded", "raw", "bytes")


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character a byte-level BPE vocabulary
    writes for each byte -> that byte (``bytes_to_unicode`` of GPT-2, Llama 3, Qwen)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: b for b in kept}
    moved = (b for b in range(256) if b not in chars)
    chars.update((b, 256 + n) for n, b in enumerate(moved))
    return {chr(c): b for b, c in chars.items()}


def _is_byte_level(spec: Any) -> bool:
    """Whether a tokenizer.json pre-tokenizer or decoder (possibly a Sequence) is ByteLevel."""
    if not isinstance(spec, dict):
        return False
    if spec.get("type") == "ByteLevel":
        return True
    parts = spec.get("pretokenizers") or spec.get("decoders") or ()
    return any(_is_byte_level(p) for p in parts)


class Vocabulary:
    """Token id for a top_logprobs entry without an ``id``.

    ``kind="decoded"`` (mlx-vlm's and vLLM's servers: ``tokenizer.decode([id])``) names an id
    only when exactly one id decodes to that text (byte fragments all decode to U+FFFD, special
    tokens to ``''`` in vLLM); ``kind="raw"`` looks the entry up among the vocabulary's own
    token strings; ``kind="bytes"`` (SGLang 0.5.23: each entry's ``bytes`` are the token's
    raw bytes, read through GPT-2's byte decoder, on a byte-level BPE tokenizer) names an id
    by its exact bytes, so byte fragments that all decode to U+FFFD are told apart; on a
    tokenizer that is not byte-level (SGLang then sends the decoded text's UTF-8) it is
    ``"decoded"``. Bytes or text that several ids share name none of them.
    """

    def __init__(self, model_dir: str | os.PathLike[str], kind: str = "decoded") -> None:
        from tokenizers import Tokenizer

        if kind not in KINDS:
            raise ValueError(f"vocabulary kind {kind!r} is not one of {', '.join(KINDS)}")
        path = os.path.join(os.fspath(model_dir), "tokenizer.json")
        tok = Tokenizer.from_file(path)
        self.kind = kind
        self._tokenizer = tok
        #: The token's raw bytes -> its id (``kind="bytes"`` on a byte-level tokenizer).
        self.raw_bytes: dict[bytes, int] = {}
        if kind == "raw":
            self.names = {str(t): i for t, i in tok.get_vocab(with_added_tokens=True).items()}
            return
        if kind == "bytes":
            with open(path, encoding="utf-8") as f:
                spec = json.load(f)
            if _is_byte_level(spec.get("pre_tokenizer")) or _is_byte_level(spec.get("decoder")):
                self.raw_bytes = _unique(_raw_bytes(tok.get_vocab(with_added_tokens=True)))
        seen: dict[str, int] = {}
        for i in range(tok.get_vocab_size(with_added_tokens=True)):
            text = tok.decode([i], skip_special_tokens=False)
            seen[text] = -1 if text in seen else i
        self.names = {t: i for t, i in seen.items() if i >= 0}

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` as a server writes a reply: special tokens left out."""
        return str(self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True))

    def __call__(self, entry: Mapping[str, Any]) -> int | None:
        if self.raw_bytes:
            raw = entry.get("bytes")
            if isinstance(raw, list) and raw:
                try:
                    return self.raw_bytes.get(bytes(raw))
                except (ValueError, TypeError):
                    return None
        token = entry.get("token")
        if not isinstance(token, str):
            raw = entry.get("bytes")
            if not isinstance(raw, list):
                return None
            try:
                token = bytes(raw).decode("utf-8")
            except (ValueError, TypeError):
                return None
        return self.names.get(token)


def _raw_bytes(vocab: Mapping[str, int]) -> list[tuple[bytes, int]]:
    """Each token's raw bytes as SGLang computes them: every character of its vocabulary
    string through the byte decoder (tokens with a character outside it are left out: SGLang
    sends their decoded text, which nothing here would tell from a real token's bytes)."""
    decoder = byte_decoder()
    out = []
    for piece, i in vocab.items():
        if piece and all(ch in decoder for ch in piece):
            out.append((bytes(decoder[ch] for ch in piece), int(i)))
    return out


def _unique(pairs: list[tuple[bytes, int]]) -> dict[bytes, int]:
    seen: dict[bytes, int] = {}
    for key, i in pairs:
        seen[key] = -1 if key in seen and seen[key] != i else i
    return {k: i for k, i in seen.items() if i >= 0}


def token_id(entry: Mapping[str, Any], vocab: Vocabulary | None = None) -> int | None:
    """The token id an entry names: its ``id``, a ``token_id:N`` token, or the vocabulary's
    id for its text (None when it cannot be told)."""
    if entry.get("id") is not None:
        return int(entry["id"])
    token = entry.get("token")
    if isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX):
        return int(token[len(TOKEN_ID_PREFIX) :])
    return vocab(entry) if vocab is not None else None


@dataclass(frozen=True)
class Reply:
    """What a chat completion reply says.

    ``steps``: top_logprobs by token id per decode step (entries whose id cannot be told are
    counted in ``unnamed``, not guessed); ``tokens``: the argmax of each step, up to the first
    step whose best entry has no id; ``labels``: the id each step's own entry names (the
    sampled token); ``raw_steps``: the entries as sent, for messages.
    """

    steps: list[dict[int, float]]
    tokens: tuple[int, ...]
    cached_tokens: int | None
    prompt_tokens: int | None
    completion_tokens: int
    labels: list[int | None] = field(default_factory=list)
    unnamed: list[list[Any]] = field(default_factory=list)
    raw_steps: list[Any] = field(default_factory=list)
    has_logprobs: bool = True
    reported_completion: int | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    completion_token_ids: tuple[int, ...] | None = None
    text: str | None = None
    """The reply's ``message.content`` (what a chat client sends back as the next assistant
    turn), or None when the reply has none."""
    prompt_seconds: float | None = None
    """The prompt-processing seconds the server reports (llama-server's
    ``timings.prompt_ms``), or None."""
    finish_reason: str | None = None
    """The choice's ``finish_reason`` (``"stop"``, ``"length"`` ...), or None."""


def _content(choice: Any) -> str | None:
    content = (choice.get("message") or {}).get("content")
    return content if isinstance(content, str) else None


def _ids(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(t) for t in value)


def parse_reply(reply: Any, vocab: Vocabulary | None = None) -> Reply:
    """Read a reply; a reply without the expected shape raises EngineError."""
    try:
        choice = reply["choices"][0]
        if choice.get("finish_reason") == "error":  # vllm-mlx: a failed request, in band
            raise EngineError(
                "the server answered finish_reason 'error' (no completion; usage "
                f"{reply.get('usage')}): the request failed inside the server, see its log"
            )
        logprobs = choice.get("logprobs")
        content = (logprobs or {}).get("content") or []
        steps: list[dict[int, float]] = []
        tokens: list[int] = []
        labels: list[int | None] = []
        unnamed: list[list[Any]] = []
        known = True
        for i, step in enumerate(content):
            top: dict[int, float] = {}
            lost: list[Any] = []
            best, best_id = float("-inf"), None
            for t in step.get("top_logprobs") or ():
                if t.get("logprob") is None:
                    raise EngineError(f"decode step {i}: a top_logprobs entry has no logprob: {t}")
                tid, lp = token_id(t, vocab), float(t["logprob"])
                if tid is None:
                    lost.append(t)
                else:
                    top[tid] = lp
                if lp > best:
                    best, best_id = lp, tid
            steps.append(top)
            unnamed.append(lost)
            labels.append(token_id(step, vocab))
            known = known and best_id is not None
            if known and best_id is not None:
                tokens.append(best_id)
        usage = reply.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        timings = reply.get("timings") or {}
        if cached is None:  # llama-server without prompt_tokens_details: timings.cache_n
            cached = timings.get("cache_n")
        prompt_ms = timings.get("prompt_ms")
        prompt = usage.get("prompt_tokens")
        reported = usage.get("completion_tokens")
        prompt_ids = reply.get("prompt_token_ids", choice.get("prompt_token_ids"))
        out = Reply(
            steps=steps,
            tokens=tuple(tokens),
            cached_tokens=None if cached is None else int(cached),
            prompt_tokens=None if prompt is None else int(prompt),
            completion_tokens=int(reported or len(steps)),
            labels=labels,
            unnamed=unnamed,
            raw_steps=list(content),
            has_logprobs=logprobs is not None,
            reported_completion=None if reported is None else int(reported),
            prompt_token_ids=_ids(prompt_ids),
            # vLLM: the choice's token_ids; SGLang 0.5.23: its response_token_ids
            completion_token_ids=_ids(choice.get("token_ids", choice.get("response_token_ids"))),
            text=_content(choice),
            prompt_seconds=None if prompt_ms is None else float(prompt_ms) / 1000,
            finish_reason=choice.get("finish_reason"),
        )
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise EngineError(
            f"unexpected chat completion reply ({exc!r}): {str(reply)[:300]}"
        ) from None
    return out


def _short(value: Any) -> str:
    return str(value)[:200]


def stopped_unreported(parsed: Reply, max_new_tokens: int) -> bool:
    """Whether the reply stopped before its first token and left that token out: asked for
    at least one token, it reports ``finish_reason "stop"``, ``usage.completion_tokens`` 0
    and no logprobs entry. The greedy first token was a stop token the server did not report
    (an OpenAI-style server may leave a stop token out: mlx_lm.server 0.31.2 drops a matched
    stop sequence, <eos> included, from its token stream); there is no logprob to read."""
    return (
        max_new_tokens > 0
        and parsed.finish_reason == "stop"
        and parsed.reported_completion == 0
        and not parsed.raw_steps
        and not parsed.completion_token_ids
    )


def logprob_problems(parsed: Reply, max_new_tokens: int, *, labels: bool = True) -> list[str]:
    """What is wrong with the reply's logprobs, each naming the decode step and what came
    back: missing, fewer or more entries than ``usage.completion_tokens``, a step without
    top_logprobs, entries that name no token id, and (``labels``, or when the reply carries
    the completion's token ids) a step whose sampled token is not its greedy one - the mark
    of logprobs shifted against the tokens. A reply that stopped before its first token
    (:func:`stopped_unreported`) has none to check."""
    if stopped_unreported(parsed, max_new_tokens):
        return []
    if not parsed.has_logprobs:
        return ["the reply has no logprobs (logprobs: null) although logprobs were requested"]
    out: list[str] = []
    n = len(parsed.raw_steps)
    reported = parsed.reported_completion
    if reported is not None and n != reported:
        out.append(
            f"{n} logprobs entries for usage.completion_tokens={reported}"
            + (f" (the last entry: {_short(parsed.raw_steps[-1])})" if n else "")
        )
    if n == 0 and max_new_tokens > 0:
        out.append("the reply's logprobs.content is empty")
    for i, (top, lost, raw) in enumerate(zip(parsed.steps, parsed.unnamed, parsed.raw_steps)):
        if not top and not lost:
            out.append(f"decode step {i}: no top_logprobs (the entry: {_short(raw)})")
            continue
        if lost:
            out.append(
                f"decode step {i}: {len(lost)} top_logprobs entr{'y' if len(lost) == 1 else 'ies'}"
                f" name no token id, e.g. {_short(lost[0])} (ask the server for token ids, e.g. "
                "vLLM's return_tokens_as_token_ids, or pass vocab=)"
            )
            continue
        best = max(top.values())
        ids = parsed.completion_token_ids
        sampled = ids[i] if ids is not None and i < len(ids) else None
        if sampled is None and labels:
            sampled = parsed.labels[i] if i < len(parsed.labels) else None
        if sampled is not None and top.get(sampled, float("-inf")) < best:
            argmax = max(top, key=top.__getitem__)
            out.append(
                f"decode step {i}: the server's token {sampled} "
                f"(logprob {top.get(sampled, 'absent')}) is not the best of this step's "
                f"top_logprobs ({argmax}: {best}): logprobs shifted against the tokens, or "
                "decoding is not greedy"
            )
    ids = parsed.completion_token_ids
    if ids is not None and len(ids) != n:
        out.append(f"{n} logprobs entries for {len(ids)} completion token_ids {list(ids)[:20]}")
    return out


def with_extension(out: Outcome, reply: Any, n: int) -> Outcome:
    """``out`` completed from reference_engine.server's ``prefixcache`` reply object."""
    ext = reply.get("prefixcache") if isinstance(reply, dict) else None
    if not isinstance(ext, dict):
        raise EngineError("extensions=True but the reply has no 'prefixcache' object")
    steps = tuple(
        np.frombuffer(base64.b64decode(b), dtype=np.float32).copy()
        for b in ext.get("step_logits") or ()
    )
    return dataclasses.replace(
        out,
        logits=steps[0] if steps else None,
        step_logits=steps[: min(n, len(out.tokens))],
        token_ids=tuple(int(t) for t in ext.get("token_ids") or ()),
        image_spans=tuple((int(a), int(b), str(d)) for a, b, d in ext.get("image_spans") or ()),
        merges=tuple((int(a), int(b)) for a, b in ext.get("merges") or ()),
        message_starts=(
            None if ext.get("message_starts") is None else tuple(map(int, ext["message_starts"]))
        ),
        served=None if ext.get("served") is None else int(ext["served"]),
        first_token_seconds=(
            out.first_token_seconds
            if ext.get("first_token_seconds") is None
            else float(ext["first_token_seconds"])
        ),
    )
