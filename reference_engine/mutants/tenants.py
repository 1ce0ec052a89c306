"""Mutants of the identities a prefix cache is shared among: class 11 of the bug zoo (one
tenant's or one adapter's cache entries reused by another).

Each is the correct engine with one path keyed without part of the identity: the adapter left
out of every key (the engine runs the fixture adapter, ``fixtures/adapters/<model>-lora``, so
streams carry it), or the namespace (the tenant, the cache salt) dropped for requests with
images only. Streams that send the same prompt under two identities see them: the first reuses
KV computed with other weights (the equivalence and the ``isolation`` check), the second
another tenant's prefix (same weights, so only the reuse bound and ``isolation`` see it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_prefixcache.types import Request

from ..blocks import BlockKey, KeyChain
from ..engine import Engine
from ..lora import FIXTURE
from ..model import LoadedModel
from ..render import Rendered

__all__ = ["AdapterNotKeyed", "SaltDroppedForImages"]


class AdapterNotKeyed(Engine):
    """Class 11, isolation: the block keys leave the adapter out.

    A request with the adapter reuses the prefix a request without it (or with another)
    cached: KV computed with other weights. Reproduces vLLM #44250 (an external KV
    connector's key omits the LoRA identity) and #42495 (an adapter reloaded in place under
    the same name reuses stale blocks).
    """

    def __init__(self, model: LoadedModel, **kwargs: Any) -> None:
        kwargs.setdefault("adapters", FIXTURE)
        super().__init__(model, **kwargs)

    def root(self, namespace: str, adapter: str | None = None) -> bytes:
        # BUG: every adapter chains from the base model's root.
        return super().root(namespace, None)


class SaltDroppedForImages(Engine):
    """Class 11, isolation: the namespace (tenant, cache salt) is left out of the keys of
    prompts with images; text prompts keep it.

    A tenant's image prompt reuses the prefix another tenant's same image prompt cached (and
    the first-token time tells the second tenant so). Reproduces SGLang #26747 (the salt
    missing from one tier's keys) and #23300 (the salt never reached the scheduler on one
    path).
    """

    def keys(self, rendered: Rendered, request: Request) -> Sequence[BlockKey]:
        if not rendered.spans:
            return super().keys(rendered, request)
        # BUG: the multimodal path hashes from the default namespace's root.
        root = self.root("", request.adapter)
        return KeyChain(rendered.token_ids, rendered.spans, block_size=self.block_size, root=root)
