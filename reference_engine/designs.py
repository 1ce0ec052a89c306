"""The reference engine's cache designs, chosen by ``cache_output`` or
``PREFIXCACHE_REFERENCE_CACHE``: ``prompt`` stores the prompt's KV, ``prompt+output`` also the
rows the decode computed (the steps of :class:`OutputDesign`, a part of
:class:`~reference_engine.engine.Engine`); and the block pool's default byte budget."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_prefixcache.errors import EngineError
from pytest_prefixcache.types import Request

from .blocks import BlockKey, KeyChain
from .render import Rendered

__all__ = [
    "CACHE_DESIGNS",
    "CACHE_ENV",
    "DEFAULT_MAX_BYTES",
    "OutputDesign",
    "cache_output_from_env",
]

#: Default byte budget of the block pool: 1 GiB of KV rows.
DEFAULT_MAX_BYTES = 1 << 30

#: The cache designs, by the name ``PREFIXCACHE_REFERENCE_CACHE`` takes.
CACHE_DESIGNS = {"prompt": False, "prompt+output": True}
CACHE_ENV = "PREFIXCACHE_REFERENCE_CACHE"


def cache_output_from_env() -> bool:
    """Whether ``PREFIXCACHE_REFERENCE_CACHE`` asks for the prompt+output design (unset or
    empty: ``prompt``); any other value is an EngineError naming it."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if not value:
        return False
    if value not in CACHE_DESIGNS:
        raise EngineError(
            f"{CACHE_ENV}={value!r} is not one of {', '.join(map(repr, CACHE_DESIGNS))}"
        )
    return CACHE_DESIGNS[value]


class OutputDesign:
    """The prompt+output design's steps (see the module)."""

    block_size: int

    if TYPE_CHECKING:

        def root(self, namespace: str, adapter: str | None = None) -> bytes: ...

        def store(self, cache: list[Any], keys: Sequence[BlockKey], first: int) -> None: ...

    def output_keys(self, rendered: Rendered, request: Request, tokens: Sequence[int]) -> KeyChain:
        """The block keys of the prompt continued by the output tokens whose KV the decode
        computed (all but the last: it is never fed back)."""
        ids = (*rendered.token_ids, *tokens[:-1])
        root = self.root(request.namespace, request.adapter)
        return KeyChain(ids, rendered.spans, block_size=self.block_size, root=root)

    def store_output(
        self, cache: list[Any], rendered: Rendered, request: Request, tokens: Sequence[int]
    ) -> None:
        """The prompt+output design: store the rows the decode computed, from the block the
        prompt ends in, under :meth:`output_keys` (the prompt's partial tail is superseded by
        the longer block)."""
        if len(tokens) < 2:
            return
        keys = self.output_keys(rendered, request, tokens)
        self.store(cache, keys, len(rendered.token_ids) // self.block_size)
