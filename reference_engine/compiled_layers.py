"""The hybrid family's recurrent decoder layers as one compiled MLX call each, inside the
engine's forward only.

On the tiny fixtures a forward's cost is its number of MLX operations, not its arithmetic:
every operation is a task handed to MLX's CPU stream thread. A GatedDeltaNet decoder layer of
mlx-vlm's ``qwen3_5`` (norm, projections, causal convolution, normalisation, gates, the
engine's scan over the piece, gated norm, output projection, MLP) is some 240 of them for a
few positions; ``mx.compile`` fuses its elementwise chains into single kernels. The layer's
cache state is two arrays of fixed shape (the convolution's last positions, the recurrent
state), so the layer is a pure function ``(x, conv, state) -> (h, conv', state')``, traced once
per input shape: :func:`install` gives each such layer of one loaded model a ``__call__`` that
runs that function inside :func:`compiled_layers` and mlx-vlm's own call everywhere else.

**Every path of the engine takes it.** Cold, warm and the audit's fresh engines all prefill
and decode through ``LoadedModel.forward``, which enters :func:`compiled_layers`; a compiled
trace may round differently from the same operations run one at a time, so a cold run
uncompiled and a warm run compiled need not agree (``tests/test_compiled_layers.py``).

**A trace is a snapshot of what the layer did when traced.** It is kept per layer and per
everything a forward reads from the calling thread's context: the LoRA adapter in effect
(:data:`ADAPTER`, which ``lora.py``'s linear layers read) and the gated-delta kernel choice
(``recurrent.choice``). A layer whose cache is anything but a plain single-sequence state (a
batch, lengths or left padding, a speculative recording), or that gets a mask, runs mlx-vlm's
own call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import mlx.core as mx

from .recurrent import choice

__all__ = ["ADAPTER", "clear", "compiled_layers", "install"]

#: The LoRA adapter (identity) whose weights the calling thread's forwards run with; None: none.
ADAPTER: ContextVar[str | None] = ContextVar("lora", default=None)
_ON: ContextVar[bool] = ContextVar("prefixcache_compiled_layers", default=False)
#: A layer's traces, in its ``__dict__`` (outside the module's parameter tree, as lora.py's).
_TRACES = "prefixcache_traces"
_CLASSES: dict[type, type] = {}


@contextmanager
def compiled_layers(on: bool = True) -> Iterator[None]:
    """Within this block, in this thread, the layers :func:`install` prepared run compiled."""
    token = _ON.set(on)
    try:
        yield
    finally:
        _ON.reset(token)


def install(language_model: Any) -> bool:
    """Prepare every recurrent decoder layer of ``language_model`` (mlx-vlm's qwen3_5 layers:
    ``is_linear`` with a ``linear_attn``); False when it has none."""
    layers = [
        layer
        for layer in getattr(getattr(language_model, "model", None), "layers", ())
        if getattr(layer, "is_linear", False) and hasattr(layer, "linear_attn")
    ]
    for layer in layers:
        cls = type(layer)
        if cls not in _CLASSES.values():
            layer.__class__ = _CLASSES.get(cls) or _CLASSES.setdefault(cls, _dispatching(cls))
            layer.__dict__[_TRACES] = {}
    return bool(layers)


def clear(language_model: Any) -> None:
    """Drop the traces of ``language_model``'s layers (a test that swaps a kernel retraces)."""
    for layer in getattr(getattr(language_model, "model", None), "layers", ()):
        layer.__dict__.get(_TRACES, {}).clear()


def _dispatching(cls: type) -> type:
    original = cls.__call__

    def __call__(
        self: Any,
        x: mx.array,
        mask: Any = None,
        cache: Any = None,
        position_ids: Any = None,
        position_embeddings: Any = None,
    ) -> Any:
        if _ON.get() and mask is None and x.shape[0] == 1 and _plain(cache):
            return _run(self, original, x, cache)
        return original(self, x, mask, cache, position_ids, position_embeddings)

    return type(cls.__name__, (cls,), {"__call__": __call__, "__module__": __name__})


def _plain(cache: Any) -> bool:
    """A single sequence's two state arrays, nothing recorded, no lengths or padding."""
    state = getattr(cache, "cache", None)
    return (
        isinstance(state, list)
        and len(state) == 2
        and not getattr(cache, "is_speculating", True)
        and getattr(cache, "lengths", 0) is None
        and getattr(cache, "left_padding", 0) is None
        and all(a is None or a.shape[0] == 1 for a in state)
        and (state[0] is None) == (state[1] is None)  # a fresh cache, or both states carried
    )


def _run(layer: Any, original: Callable[..., Any], x: mx.array, cache: Any) -> mx.array:
    conv, state = cache[0], cache[1]
    first = conv is None
    key = (ADAPTER.get(), choice(), first)
    traces: dict[Any, Callable[..., Any]] = layer.__dict__[_TRACES]
    fn = traces.get(key)
    if fn is None:
        fn = traces[key] = mx.compile(_pure(layer, original, type(cache), first))
    h, cache[0], cache[1] = fn(x) if first else fn(x, conv, state)
    return h  # type: ignore[no-any-return]


def _pure(
    layer: Any, original: Callable[..., Any], cache_class: type, first: bool
) -> Callable[..., Any]:
    """mlx-vlm's call on a new cache of the engine's cache class holding the given states (none
    on a first piece, as a fresh cache holds), returning the output and the states it leaves."""

    def layer_fn(x: mx.array, conv: Any = None, state: Any = None) -> tuple[mx.array, ...]:
        cache = cache_class(2)
        if not first:
            cache[0], cache[1] = conv, state
        h = original(layer, x, None, cache)
        return h, cache[0], cache[1]

    return layer_fn
