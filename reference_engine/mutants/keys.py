"""Mutants whose block keys are wrong: classes 1, 4, 5, 6 and 11 of the bug zoo.

Each overrides only ``Engine.keys``: what a block is stored and looked up under. The KV rows,
the vision rows and the prefill are those of the correct engine, so every wrong answer comes
from a block reused where it does not belong.
"""

from __future__ import annotations

import numpy as np

from pytest_prefixcache.types import Request

from ..blocks import BlockKey, block_keys, hash_block, namespace_root
from ..engine import Engine
from ..render import Rendered

__all__ = [
    "ImageOrderIgnored",
    "NamespaceMissing",
    "PlaceholderCollision",
    "UnchainedBlocks",
    "WeakImageHash",
    "xor_fold_digest",
]


class PlaceholderCollision(Engine):
    """Class 1, placeholder collision: the key is the token ids only.

    Every image expands to the same ``<|image_pad|>`` run, so two different images of the same
    size give the same keys and the second request is served the first image's KV.
    Reproduces ROCm/ATOM #1358, waybarrios/vllm-mlx #718, vllm-project/vllm #20261 and
    LMCache #4783 (different images share the same multimodal cache keys).
    """

    def keys(self, rendered: Rendered, request: Request) -> list[BlockKey]:
        root = namespace_root(self.model.fingerprint, request.namespace)
        # BUG: the image spans (digests) are left out of the block keys.
        return block_keys(rendered.token_ids, [], block_size=self.block_size, root=root)


def xor_fold_digest(pixels: np.ndarray) -> str:
    """A weak image hash: the XOR of the pixel bytes as little-endian 64-bit words, without
    the shape (as GPU-friendly XOR tensor hashes do). Every solid 64x64 image folds to 0."""
    raw = np.ascontiguousarray(pixels).tobytes()
    raw += b"\0" * (-len(raw) % 8)
    words = np.frombuffer(raw, dtype="<u8")
    return f"xor:{int(np.bitwise_xor.reduce(words)) if words.size else 0:016x}"


class WeakImageHash(Engine):
    """Class 4, weak or lossy hash: images are keyed by a 64-bit XOR fold of their pixel
    bytes, without their shape.

    The fold cancels repeated patterns (all 64x64 solid colours fold to 0, whatever the
    colour) and ignores the shape, so distinct images collide and the cache serves one
    image's KV for another. Reproduces the weak media hashes of sglang #25462 and #8342 (XOR
    tensor hash), LMCache #3301 (16-bit multimodal hash) and vllm-mlx ce1639a; the
    shape-blind ``tobytes()`` hash of ai-dynamo/dynamo #8340.
    """

    def keys(self, rendered: Rendered, request: Request) -> list[BlockKey]:
        root = namespace_root(self.model.fingerprint, request.namespace)
        # BUG: each span names its image by a weak, shape-blind hash instead of its digest.
        spans = [
            (start, end, xor_fold_digest(image.pixels))
            for (start, end, _), image in zip(rendered.spans, rendered.images)
        ]
        return block_keys(rendered.token_ids, spans, block_size=self.block_size, root=root)


class ImageOrderIgnored(Engine):
    """Class 5, image order ignored: the image digests are sorted before they are combined.

    ``[A, B]`` and ``[B, A]`` (same sizes) then share every key and the answer mixes up the
    images. Reproduces waybarrios/vllm-mlx ``mllm_cache.py`` before the fix in #726.
    """

    def keys(self, rendered: Rendered, request: Request) -> list[BlockKey]:
        root = namespace_root(self.model.fingerprint, request.namespace)
        # BUG: digests are assigned to the spans in sorted order, not in order of appearance.
        digests = sorted(d for _, _, d in rendered.spans)
        spans = [(s, e, d) for (s, e, _), d in zip(rendered.spans, digests)]
        return block_keys(rendered.token_ids, spans, block_size=self.block_size, root=root)


class UnchainedBlocks(Engine):
    """Class 6, block match ignores the chain: each block is hashed on its own tokens and
    image extras, with the namespace root as parent for every block.

    The same block of text after a different prefix (say after a different image of the same
    size) then matches a block whose KV was computed after that other prefix. Reproduces
    waybarrios/vllm-mlx ``paged_cache.py`` (per-block hashes without the parent).
    """

    def keys(self, rendered: Rendered, request: Request) -> list[BlockKey]:
        root = namespace_root(self.model.fingerprint, request.namespace)
        chained = block_keys(
            rendered.token_ids, rendered.spans, block_size=self.block_size, root=root
        )
        # BUG: no parent chaining: block i's key does not depend on blocks 0..i-1.
        return [
            BlockKey(k.index, hash_block(root, k.tokens, k.extras), root, k.tokens, k.extras)
            for k in chained
        ]


class NamespaceMissing(Engine):
    """Class 11, namespace missing: the key's root is the model fingerprint only; the
    request's namespace (adapter, tenant, cache salt) is left out.

    Another tenant's identical prompt is served from the first tenant's blocks. The logits
    are even right for this engine (one model), so only the reuse bound can see it: the
    oracle allows no reuse across namespaces. Reproduces vllm-project/vllm #30931 and #42495,
    sglang #24638, vllm-mlx 01261c1.
    """

    def keys(self, rendered: Rendered, request: Request) -> list[BlockKey]:
        # BUG: request.namespace is not part of the root.
        root = namespace_root(self.model.fingerprint)
        return block_keys(rendered.token_ids, rendered.spans, block_size=self.block_size, root=root)
