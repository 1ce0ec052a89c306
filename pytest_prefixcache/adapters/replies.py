"""Reading OpenAI chat completion replies: top_logprobs by token id, usage figures.

Sorting is done here: never trust a step's own ``id``/``token`` label (mlx-lm 0.32.2 reports
the first element of an unsorted top-k there). Entries without an ``id`` (mlx-vlm's server)
are named through a :class:`Vocabulary`.
"""

from __future__ import annotations

import base64
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import EngineError
from ..types import Outcome

__all__ = ["Reply", "Vocabulary", "parse_reply", "with_extension"]


class Vocabulary:
    """Token id for a top_logprobs entry without an ``id``.

    ``kind="decoded"`` (mlx-vlm's server: ``tokenizer.decode([id])``) names an id only when
    exactly one id decodes to that text (byte fragments all decode to U+FFFD); ``kind="raw"``
    looks the entry up among the vocabulary's own token strings.
    """

    def __init__(self, model_dir: str | os.PathLike[str], kind: str = "decoded") -> None:
        from tokenizers import Tokenizer

        if kind not in ("decoded", "raw"):
            raise ValueError(f"kind {kind!r} is not 'decoded' or 'raw'")
        tok = Tokenizer.from_file(os.path.join(os.fspath(model_dir), "tokenizer.json"))
        if kind == "raw":
            self.names = {str(t): i for t, i in tok.get_vocab(with_added_tokens=True).items()}
            return
        seen: dict[str, int] = {}
        for i in range(tok.get_vocab_size(with_added_tokens=True)):
            text = tok.decode([i], skip_special_tokens=False)
            seen[text] = -1 if text in seen else i
        self.names = {t: i for t, i in seen.items() if i >= 0}

    def __call__(self, entry: Mapping[str, Any]) -> int | None:
        token = entry.get("token")
        return self.names.get(token) if isinstance(token, str) else None


@dataclass(frozen=True)
class Reply:
    """What a chat completion reply says."""

    steps: list[dict[int, float]]
    tokens: tuple[int, ...]
    cached_tokens: int | None
    prompt_tokens: int | None
    completion_tokens: int


def _token_id(entry: Mapping[str, Any], vocab: Vocabulary | None) -> int | None:
    if "id" in entry and entry["id"] is not None:
        return int(entry["id"])
    return vocab(entry) if vocab is not None else None


def parse_reply(reply: Any, vocab: Vocabulary | None = None) -> Reply:
    """The top_logprobs by token id per step (entries whose id cannot be told are left out),
    the greedy tokens (the argmax of each step, up to the first step whose best entry has no
    known id) and the usage figures."""
    try:
        choice = reply["choices"][0]
        content = (choice.get("logprobs") or {}).get("content") or []
        steps: list[dict[int, float]] = []
        tokens: list[int] = []
        known = True
        for step in content:
            top: dict[int, float] = {}
            best, best_id = float("-inf"), None
            for t in step.get("top_logprobs") or ():
                tid, lp = _token_id(t, vocab), float(t["logprob"])
                if tid is not None:
                    top[tid] = lp
                if lp > best:
                    best, best_id = lp, tid
            steps.append(top)
            known = known and best_id is not None
            if known and best_id is not None:
                tokens.append(best_id)
        usage = reply.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        prompt = usage.get("prompt_tokens")
        completion = int(usage.get("completion_tokens") or len(steps))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise EngineError(
            f"unexpected chat completion reply ({exc!r}): {str(reply)[:300]}"
        ) from None
    return Reply(
        steps=steps,
        tokens=tuple(tokens),
        cached_tokens=None if cached is None else int(cached),
        prompt_tokens=None if prompt is None else int(prompt),
        completion_tokens=completion,
    )


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
    )
