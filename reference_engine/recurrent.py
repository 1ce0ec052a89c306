"""The gated-delta kernel per prefill piece: sequential for short pieces, the chunked scan above.

A hybrid model's cold and warm prefills are cut at the same segment boundaries (``engine.py``),
so its GatedDeltaNet layers run over pieces of mostly a few tokens. On CPU mlx-vlm's
``qwen3_5`` sends every multi-token piece through ``gated_delta_chunked``, a scan padded to 64
positions whose cost hardly depends on the piece's length; the sequential recurrence
(``gated_delta_ops``) costs about one step per position and is faster for short pieces
(``benchmarks/gated_delta_pieces.py``).

:func:`install` replaces the module attribute ``gated_delta_chunked`` of
``mlx_vlm.models.qwen3_5.gated_delta`` (the name its ``gated_delta_update`` calls) by a
dispatcher that behaves exactly as the original unless the calling thread is inside
:func:`sequential_pieces`: every other user of mlx-vlm in the process (the peers measured side by
side with the reference engine) keeps mlx-vlm's own choice, bit for bit. Inside it, a piece of at
most ``limit`` positions runs sequentially. The choice depends on the piece's length alone, and
cold and warm runs cut at the same places, so both take the same choice for every piece and the
engine stays bit-exact (``tests/test_recurrent_pieces.py``; the two implementations differ in
rounding, which the test shows too).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["SEQUENTIAL_UP_TO", "install", "original_chunked", "sequential_pieces"]

#: The longest piece the engine runs through the sequential kernel: the longest length measured
#: faster than the chunked scan on an idle and on a loaded machine (benchmarks/results/).
SEQUENTIAL_UP_TO = 96

_MODULE = "mlx_vlm.models.qwen3_5.gated_delta"
_LIMIT: ContextVar[int] = ContextVar("prefixcache_sequential_up_to", default=0)
_lock = threading.Lock()
_MARK = "__prefixcache_original__"


def _module() -> Any:
    return importlib.import_module(_MODULE)


def original_chunked() -> Callable[..., Any]:
    """mlx-vlm's own ``gated_delta_chunked`` (whether or not :func:`install` ran)."""
    fn = _module().gated_delta_chunked
    return getattr(fn, _MARK, fn)


def install() -> bool:
    """Put the dispatcher in place (once per process); False where mlx-vlm has no such module."""
    try:
        module = _module()
    except ImportError:
        return False
    with _lock:
        current = module.gated_delta_chunked
        if hasattr(current, _MARK):
            return True
        chunked, sequential = current, module.gated_delta_ops

        def gated_delta_chunked(
            q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, mask: Any = None, C: int = 64
        ) -> Any:
            if q.shape[1] <= _LIMIT.get():
                return sequential(q, k, v, g, beta, state, mask)
            return chunked(q, k, v, g, beta, state, mask, C)

        setattr(gated_delta_chunked, _MARK, chunked)
        gated_delta_chunked.__doc__ = chunked.__doc__
        module.gated_delta_chunked = gated_delta_chunked
    return True


@contextmanager
def sequential_pieces(limit: int = SEQUENTIAL_UP_TO) -> Iterator[None]:
    """Within this block, in this thread, pieces of at most ``limit`` positions run through the
    sequential kernel (0: mlx-vlm's own choice)."""
    token = _LIMIT.set(limit)
    try:
        yield
    finally:
        _LIMIT.reset(token)
