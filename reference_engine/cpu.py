"""Bit-identical rewrites of the language model's products for MLX on CPU.

On CPU, MLX multiplies with the reference BLAS (the Linux wheels), whose loop order makes
``a @ b.T`` (``b`` row-major) slower than ``a @ c`` with ``c``, equal to ``b.T``, stored
contiguous; both sum over the shared dimension in the same order, so the results are
bit-identical (``tests/test_engine.py`` checks it on the fixture). Two products of a prefill
have that shape: every linear layer (``x @ weight.T``) and the attention scores (``queries @
keys.T`` inside ``mx.fast.scaled_dot_product_attention``, which MLX computes on CPU by its
unfused fallback). ``transpose_linears`` stores the weights transposed once, at load;
``kv_cache_class(transposed=True)`` hands attention the keys of a prefill chunk as a view of
a transposed copy, so that the fallback's ``swapaxes`` gives it the contiguous layout (the
copy is of the keys alone, per layer and chunk: small next to the scores).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import mlx.core as mx
import mlx.nn as nn

__all__ = ["TransposedLinear", "kv_cache_class", "transpose_linears"]


class TransposedLinear(nn.Module):
    """``nn.Linear`` with its weight stored transposed, (in, out) and contiguous: ``x @
    weight_t``, the bias added after the product (which on CPU is what ``nn.Linear``'s
    ``mx.addmm`` gives, bit for bit; ``mx.addmm`` with the transposed weight is not)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight_t = mx.contiguous(linear.weight.T)
        if "bias" in linear:
            self.bias = linear.bias

    def __call__(self, x: mx.array) -> mx.array:
        y = x @ self.weight_t
        return y + self["bias"] if "bias" in self else y


def transpose_linears(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` (exactly; quantized layers stay) inside ``module`` by a
    ``TransposedLinear``; return how many were replaced."""
    replaced = 0
    for _, parent in module.named_modules():
        for name, child in list(parent.items()):
            if type(child) is nn.Linear:
                parent[name] = TransposedLinear(child)
                replaced += 1
    mx.eval(module.parameters())
    return replaced


@cache
def kv_cache_class(*, transposed: bool) -> Any:
    """mlx-vlm's ``KVCache``; with ``transposed``, a subclass whose ``update_and_fetch``, for
    a chunk of more than one position, returns the keys as a view of a transposed copy (the
    rows it stores, ``state`` and everything else unchanged)."""
    from mlx_vlm.models.cache import KVCache

    if not transposed:
        return KVCache

    class TransposedKeysKVCache(KVCache):  # type: ignore[misc]
        def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
            k, v = super().update_and_fetch(keys, values)
            if keys.shape[2] > 1:  # a prefill chunk, not a decode step
                k = mx.swapaxes(mx.contiguous(mx.swapaxes(k, -1, -2)), -1, -2)
            return k, v

    return TransposedKeysKVCache
