"""The gated-delta kernel per prefill piece: sequential for short pieces, a finer scan above.

A hybrid model's cold and warm prefills are cut at the same segment boundaries (``engine.py``),
so its GatedDeltaNet layers run over pieces of mostly a few tokens. On CPU mlx-vlm's
``qwen3_5`` sends every multi-token piece through ``gated_delta_chunked`` with chunks of 64
positions: a scan padded to 64 positions whose 63-step triangular solve makes its cost hardly
depend on the piece's length. The sequential recurrence (``gated_delta_ops``) costs about one
step per position, and the same chunked scan with chunks of :data:`PIECE_CHUNK` positions (a
7-step solve per chunk, all chunks at once, then one step per chunk) costs less than either
past a few positions (``benchmarks/gated_delta_pieces.py``).

:func:`install` replaces the module attribute ``gated_delta_chunked`` of
``mlx_vlm.models.qwen3_5.gated_delta`` (the name its ``gated_delta_update`` calls) by a
dispatcher that behaves exactly as the original unless the calling thread is inside
:func:`sequential_pieces`: every other user of mlx-vlm in the process (the peers measured side by
side with the reference engine) keeps mlx-vlm's own choice, bit for bit. Inside it, a piece of at
most ``limit`` positions runs sequentially, a longer one through the chunked scan with chunks of
``chunk`` positions. The choice depends on the piece's length alone, and cold and warm runs cut
at the same places, so both take the same choice for every piece and the engine stays bit-exact
(``tests/test_recurrent_pieces.py``; the implementations differ in rounding, which the test
shows too).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["PIECE_CHUNK", "SEQUENTIAL_UP_TO", "install", "original_chunked", "sequential_pieces"]

#: The longest piece the engine runs through the sequential kernel: the longest length measured
#: faster than the chunked scan with chunks of PIECE_CHUNK (benchmarks/results/).
SEQUENTIAL_UP_TO = 6
#: The chunk of the scan for longer pieces (mlx-vlm's default: 64).
PIECE_CHUNK = 8

_MODULE = "mlx_vlm.models.qwen3_5.gated_delta"
#: (longest sequential piece, chunk of the scan above it); (0, 0): mlx-vlm's own choice.
_CHOICE: ContextVar[tuple[int, int]] = ContextVar("prefixcache_piece_kernels", default=(0, 0))
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
            limit, chunk = _CHOICE.get()
            if q.shape[1] <= limit:
                return sequential(q, k, v, g, beta, state, mask)
            return chunked(q, k, v, g, beta, state, mask, chunk or C)

        setattr(gated_delta_chunked, _MARK, chunked)
        gated_delta_chunked.__doc__ = chunked.__doc__
        module.gated_delta_chunked = gated_delta_chunked
    return True


@contextmanager
def sequential_pieces(limit: int = SEQUENTIAL_UP_TO, chunk: int = PIECE_CHUNK) -> Iterator[None]:
    """Within this block, in this thread, pieces of at most ``limit`` positions run through the
    sequential kernel and longer ones through the chunked scan with chunks of ``chunk``
    positions (0 and 0: mlx-vlm's own choice)."""
    if limit < 0 or chunk < 0:
        raise ValueError(f"limit and chunk must be at least 0, got {limit!r} and {chunk!r}")
    token = _CHOICE.set((limit, chunk))
    try:
        yield
    finally:
        _CHOICE.reset(token)
