"""Tokenising a rendered prompt piece by piece, remembering each piece's token ids.

A Hugging Face tokenizer cuts its input at added tokens (``<|im_start|>``, ``<|im_end|>``,
``<|image_pad|>``, ...) before anything else, and tokenises the text between them separately.
So the ids of a prompt are those of its pieces between added tokens, in order, with each added
token's id in between, and a piece seen before (an earlier turn of the conversation, the
system prompt) need not be tokenised again. That cut is exact only for added tokens that do not
strip neighbouring whitespace, match whole words only or match after normalisation:
``PieceTokenizer.for_tokenizer`` returns None for a tokenizer with any such token, and the
engine then tokenises whole prompts.

The engine tokenises piece by piece on cached runs only; uncached runs tokenise the whole
prompt, so the plugin's cached-vs-uncached comparison also checks this shortcut. Pieces are
remembered per namespace, like the KV blocks: a piece another tenant sent is not a faster hit
(a timing side channel the plugin's isolation audit measures).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

__all__ = ["MAX_CHARS", "PieceTokenizer"]


#: Characters of remembered pieces, at most: a long conversation. What they keep in memory
#: when full, with their ids: ``benchmarks/pieces.py`` (README, "Memory under a small budget").
MAX_CHARS = 1 << 18


class PieceTokenizer:
    """Token ids of texts, by pieces between added tokens; the most recently used pieces are
    remembered, ``max_chars`` characters of them at most."""

    def __init__(self, tokenizer: Any, added: dict[str, int], max_chars: int = MAX_CHARS) -> None:
        if max_chars <= 0:
            raise ValueError(f"max_chars must be positive, got {max_chars}")
        self._tokenizer = tokenizer
        self._added = added
        alternatives = sorted(added, key=len, reverse=True)  # longest first, as HF matches
        self._split = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")")
        self._pieces: OrderedDict[tuple[str, str], tuple[int, ...]] = OrderedDict()
        self._max = max_chars
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, max_chars: int = MAX_CHARS) -> PieceTokenizer | None:
        """A piece tokenizer for ``tokenizer``, or None when cutting at its added tokens
        would not give the ids the whole text gets (see the module)."""
        decoder = getattr(tokenizer, "added_tokens_decoder", None)
        if not decoder:
            return None
        added = {}
        for token_id, token in decoder.items():
            flags = (getattr(token, f, True) for f in ("lstrip", "rstrip", "single_word"))
            if any(flags) or getattr(token, "normalized", True):
                return None
            added[str(token.content)] = int(token_id)
        pieces = cls(tokenizer, added, max_chars)
        if not pieces.agrees(_probe(list(added))):
            return None
        pieces.clear()
        return pieces

    def agrees(self, text: str) -> bool:
        """Whether ``text`` gets the same ids piece by piece as whole."""
        whole = self._tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.encode(text) == tuple(int(t) for t in whole)

    def encode(self, text: str, namespace: str = "") -> tuple[int, ...]:
        """The token ids of ``text`` (no special tokens added around it); the pieces are
        remembered for ``namespace`` only."""
        ids: list[int] = []
        for piece in self._split.split(text):
            if not piece:
                continue
            token = self._added.get(piece)
            if token is not None:
                ids.append(token)
            else:
                ids.extend(self._piece(piece, namespace))
        return tuple(ids)

    def _piece(self, piece: str, namespace: str) -> tuple[int, ...]:
        key = (namespace, piece)
        with self._lock:
            found = self._pieces.get(key)
            if found is not None:
                self._pieces.move_to_end(key)
                self.hits += 1
                return found
        ids = tuple(int(t) for t in self._tokenizer(piece, add_special_tokens=False)["input_ids"])
        with self._lock:
            self.misses += 1
            if len(piece) <= self._max and key not in self._pieces:
                self._pieces[key] = ids
                self._chars += len(piece)
                while self._chars > self._max:
                    self._chars -= len(self._pieces.popitem(last=False)[0][1])
        return ids

    def clear(self) -> None:
        """Forget every piece and zero the counters."""
        with self._lock:
            self._pieces.clear()
            self._chars = 0
            self.hits = self.misses = 0


def _probe(added: list[str]) -> str:
    """Text with added tokens next to spaces, newlines, words and each other (a tokenizer
    that adds a prefix space to a text's first word fails it at "{a}u")."""
    a, b = added[0], added[-1]
    return f"x {a}\n y{b} z \n\n{a}{b}{a} w {b}\n\n  v{a}u{b}"
