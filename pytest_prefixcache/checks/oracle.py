"""The reuse oracle: the longest prefix a correct cache could have reused for a request.

A position of a prompt is keyed by its token id and, inside an image's placeholder run, by
(image digest, offset in the image). Two prompts share a prefix of length L when their keys
agree at every position below L, so a placeholder matches only the same image at the same
offset, and text matches text. The oracle's maximum for a request is the longest such prefix
shared with any earlier request of the same namespace, capped at ``prompt_tokens - 1``
because at least one prompt token must be computed to produce logits.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

__all__ = ["Match", "ReuseOracle", "position_keys", "shared_prefix"]

Key = tuple[int, str, int]
"""(token id, image digest or "", offset in the image or -1) for one prompt position."""


def position_keys(token_ids: Sequence[int], spans: Sequence[tuple[int, int, str]]) -> list[Key]:
    """The key of every position of a prompt."""
    keys: list[Key] = [(int(t), "", -1) for t in token_ids]
    for start, end, digest in spans:
        for pos in range(max(start, 0), min(end, len(keys))):
            keys[pos] = (keys[pos][0], digest, pos - start)
    return keys


def shared_prefix(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """The length of the longest common prefix of two sequences (of keys, token ids, ...)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class Match:
    """The oracle's answer for one request."""

    max_reuse: int
    """Longest valid reusable prefix, capped at prompt length - 1."""
    shared: int
    """Longest shared prefix before the cap."""
    source: int | None
    """Stream index of the earlier request that shares it (None if nothing is shared)."""


@dataclass
class ReuseOracle:
    """Remembers the prompts of the cached runs so far, per namespace."""

    _history: dict[str, list[tuple[int, list[Key]]]] = field(default_factory=dict)

    def reset(self) -> None:
        self._history.clear()

    def match(
        self,
        namespace: str,
        token_ids: Sequence[int],
        spans: Sequence[tuple[int, int, str]],
    ) -> Match:
        """What could validly be reused for this prompt, given the prompts seen before."""
        keys = position_keys(token_ids, spans)
        best, source = 0, None
        for index, earlier in self._history.get(namespace, ()):
            n = shared_prefix(keys, earlier)
            if n > best:
                best, source = n, index
        return Match(max(0, min(best, len(keys) - 1)), best, source)

    def add(
        self,
        index: int,
        namespace: str,
        token_ids: Sequence[int],
        spans: Sequence[tuple[int, int, str]],
    ) -> None:
        """Record the prompt of the cached run of stream request ``index``."""
        self._history.setdefault(namespace, []).append((index, position_keys(token_ids, spans)))
