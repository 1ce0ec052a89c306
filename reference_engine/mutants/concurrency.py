"""A concurrency mutant: class 10 of the bug zoo (the wrong batch row is stored).

The plugin drives an engine one call at a time, so the race is made deterministic: the
engine models a continuous batch of two rows, the request being served and the one before
it (still in flight), and extracts the rows to store from the wrong one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..blocks import BlockKey
from ..engine import Engine

__all__ = ["WrongBatchRow"]


class WrongBatchRow(Engine):
    """Class 10, concurrency: the KV stored under a request's keys is read from the other
    row of the batch, the previous request's cache, when there is one.

    A later hit on those blocks gets the other request's KV. Reproduces
    ml-explore/mlx-lm 23af8570 (#976: the prompt cache of the wrong batch row was saved) and
    jundot/omlx a74d499 (a late-bound generator stored another request's cache).
    """

    _other: list[Any] | None = None

    def store(self, cache: list[Any], keys: Sequence[BlockKey], first: int) -> None:
        other, self._other = self._other, cache
        # BUG: rows come from batch row (i + 1) % 2: the previous request's cache.
        super().store(other if other is not None else cache, keys, first)

    def reset(self) -> None:
        super().reset()
        self._other = None
