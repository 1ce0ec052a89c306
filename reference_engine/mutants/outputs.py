"""Mutants of the prompt+output design (``Engine(cache_output=True)``): class 7 of the bug
zoo, where the KV a decode computed is stored under the wrong key.

They are caught only by a stream whose next turn carries the engine's own reply (a
closed-loop stream, ``request_streams(closed_loop=...)``): an open-loop turn's assistant text
never matches the generated tokens, so no lookup reaches the stored output rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from pytest_prefixcache.types import Request

from ..engine import Engine
from ..model import LoadedModel
from ..render import Rendered
from .state import _Rows

__all__ = ["OutputKvOffByOne"]


def _shifted(buf: mx.array, start: int, rows: int) -> mx.array:
    """``buf`` with rows [start, start + rows) replaced by rows [start - 1, start + rows - 1)."""
    return mx.concatenate([buf[:, :, :start], buf[:, :, start - 1 : start + rows - 1]], axis=2)


class OutputKvOffByOne(Engine):
    """Class 7, key does not match contents, in the prompt+output design: the KV rows the
    decode computed are stored one position off, each output token's key holding the row of
    the token before it (the cache offset read one step late: the first output row is the
    prompt's last).

    The prompt's own blocks are right, so every open-loop request passes; the next turn that
    carries the reply reuses the shifted rows and its logits move. Reproduces the vllm-mlx #90
    review (a cache keyed by prompt + output saved with ``prompt_len=5, cache_offset=6``) and
    vllm-mlx #3 (prompt + output keys).
    """

    def __init__(self, model: LoadedModel, **options: Any) -> None:
        if options.get("cache_output") is None:  # the design it breaks, whatever the env says
            options["cache_output"] = True
        super().__init__(model, **options)

    def store_output(
        self, cache: list[Any], rendered: Rendered, request: Request, tokens: Sequence[int]
    ) -> None:
        if len(tokens) < 2:
            return
        n, computed = len(rendered.token_ids), len(tokens) - 1
        full = set(self.model.full_layers)
        # BUG: the output's rows shifted by one position (row p - 1 stored as row p).
        rows = [
            _Rows(_shifted(c.keys, n, computed), _shifted(c.values, n, computed))
            if i in full
            else c
            for i, c in enumerate(cache)
        ]
        self.store(rows, self.output_keys(rendered, request, tokens), n // self.block_size)
