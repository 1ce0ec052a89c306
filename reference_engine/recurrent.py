"""The gated-delta kernel of the engine's prefill pieces: one scan, whatever the piece's length.

A hybrid model's cold and warm prefills are cut at the same segment boundaries (``engine.py``),
so its GatedDeltaNet layers run over pieces of mostly a few tokens. On CPU mlx-vlm's
``qwen3_5`` sends every multi-token piece through ``gated_delta_chunked`` with chunks of 64
positions: a scan padded to 64 positions whose 63-step triangular solve, written as Python
forward substitution, makes its cost hardly depend on the piece's length. On the tiny fixtures
a call's cost is its number of MLX operations, not its arithmetic. So the engine runs every
piece of two or more positions through :func:`scan`: the same chunked algorithm in chunks of
:data:`PIECE_CHUNK` positions, the last one padded, with each chunk's unit lower-triangular
system inverted by one LAPACK call (``mx.linalg.tri_inv``) instead of a loop
(``benchmarks/gated_delta_pieces.py``).

**One kernel for every length, in chunks from the piece's start.** The rows a piece computes
are stored in blocks that later prompts reuse, and a later prompt's piece over the same
positions may end elsewhere (the next boundary is past where the two prompts diverge). A
position's output must therefore not depend on where its piece ends: with chunks of a fixed
size counted from the piece's start, it depends only on the positions up to its own chunk's end
(a padded position is a zero update), whatever follows. A kernel chosen by the piece's length
(the sequential recurrence for short pieces, as the engine once did) rounds a shared position
differently in the two prompts, and the second, resumed from the first's blocks, is no longer
bit-exact against its cold run (``tests/test_recurrent_pieces.py``, with that negative control
and the saved stream that found it).

:func:`install` replaces the module attribute ``gated_delta_chunked`` of
``mlx_vlm.models.qwen3_5.gated_delta`` (the name its ``gated_delta_update`` calls) by a
dispatcher that behaves exactly as the original unless the calling thread is inside
:func:`sequential_pieces`: every other user of mlx-vlm in the process (the peers measured side by
side with the reference engine) keeps mlx-vlm's own choice, bit for bit. Inside it, a piece of at
most ``limit`` positions runs sequentially (``limit`` 1 in the engine: single positions only,
which mlx-vlm never sends here), a longer one through :func:`scan` with chunks of ``chunk``
positions.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import mlx.core as mx

__all__ = [
    "PIECE_CHUNK",
    "SEQUENTIAL_UP_TO",
    "choice",
    "install",
    "original_chunked",
    "scan",
    "sequential_pieces",
]

#: The longest piece the engine runs through the sequential kernel: single positions (a choice by
#: length would make a position's rounding depend on where its piece ends: see the module).
SEQUENTIAL_UP_TO = 1
#: The chunk of :func:`scan` (mlx-vlm's default: 64; benchmarks/results/gated_delta_pieces.json).
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
            if not chunk:
                return chunked(q, k, v, g, beta, state, mask, C)
            if q.shape[1] <= limit:
                return sequential(q, k, v, g, beta, state, mask)
            return scan(q, k, v, g, beta, state, mask, chunk)

        setattr(gated_delta_chunked, _MARK, chunked)
        gated_delta_chunked.__doc__ = chunked.__doc__
        module.gated_delta_chunked = gated_delta_chunked
    return True


@contextmanager
def sequential_pieces(limit: int = SEQUENTIAL_UP_TO, chunk: int = PIECE_CHUNK) -> Iterator[None]:
    """Within this block, in this thread, pieces of at most ``limit`` positions run through the
    sequential kernel and longer ones through :func:`scan` with chunks of ``chunk`` positions
    (``chunk`` 0: mlx-vlm's own choice for every piece)."""
    if limit < 0 or chunk < 0:
        raise ValueError(f"limit and chunk must be at least 0, got {limit!r} and {chunk!r}")
    token = _CHOICE.set((limit, chunk))
    try:
        yield
    finally:
        _CHOICE.reset(token)


def choice() -> tuple[int, int]:
    """The calling thread's (longest sequential piece, chunk of the scan); (0, 0): mlx-vlm's."""
    return _CHOICE.get()


def scan(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array | None,
    mask: mx.array | None = None,
    chunk: int = PIECE_CHUNK,
) -> tuple[mx.array, mx.array]:
    """The gated delta rule over a piece (scalar gating; shapes as mlx-vlm's
    ``gated_delta_chunked``: q, k ``[B, T, Hk, Dk]``, v ``[B, T, Hv, Dv]``, g and beta
    ``[B, T, Hv]``, state ``[B, Hv, Dv, Dk]``): mlx-vlm's chunked algorithm, with each chunk's
    unit lower-triangular system inverted by ``mx.linalg.tri_inv`` (one operation) instead of
    forward substitution (one per row), in chunks of ``chunk`` positions from the piece's start
    (the last one padded: a position's output depends on no position past its chunk). Returns
    the outputs ``[B, T, Hv, Dv]`` and the final state (float32)."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    in_dtype = v.dtype
    if (rf := Hv // Hk) > 1:
        q, k = mx.repeat(q, rf, -2), mx.repeat(k, rf, -2)
    if mask is not None:  # padding positions: no decay, no update
        g = mx.where(mask[..., None], g, 1.0)
        beta = mx.where(mask[..., None], beta, 0.0)
    C = chunk
    pad = (C - T % C) % C
    if pad:
        q, k = (mx.concatenate([x, mx.zeros((B, pad, Hv, Dk), x.dtype)], axis=1) for x in (q, k))
        v = mx.concatenate([v, mx.zeros((B, pad, Hv, Dv), v.dtype)], axis=1)
        g = mx.concatenate([g, mx.ones((B, pad, Hv), g.dtype)], axis=1)
        beta = mx.concatenate([beta, mx.zeros((B, pad, Hv), beta.dtype)], axis=1)
    n = (T + pad) // C

    def chunks(x: mx.array, d: int) -> mx.array:  # [B, Hv, n, C, d]
        return x.reshape(B, n, C, Hv, d).transpose(0, 3, 1, 2, 4).astype(mx.float32)

    q, k, v = chunks(q, Dk), chunks(k, Dk), chunks(v, Dv)
    g = g.reshape(B, n, C, Hv).transpose(0, 3, 1, 2)
    beta = beta.reshape(B, n, C, Hv).transpose(0, 3, 1, 2)
    lcg = mx.cumsum(mx.log(mx.clip(g, 1e-6, 1.0)), axis=-1)  # log of the cumulative decay
    cumg = mx.exp(lcg)
    lower = mx.tril(mx.ones((C, C), mx.float32), 0)
    decay = mx.exp(mx.where(lower > 0, lcg[..., :, None] - lcg[..., None, :], -1e30))
    a = beta[..., :, None] * decay * (k @ mx.swapaxes(k, -1, -2)) * mx.tril(lower, -1)
    inverse = mx.linalg.tri_inv(mx.eye(C, dtype=mx.float32) + a, upper=False, stream=mx.cpu)
    u = inverse @ (beta[..., :, None] * v)
    kt = inverse @ ((beta * cumg)[..., :, None] * k)
    m = decay * (q @ mx.swapaxes(k, -1, -2)) * lower
    qeff = cumg[..., :, None] * q - m @ kt
    mu = m @ u
    last = cumg[..., -1]
    ratio = mx.exp(lcg[..., -1, None] - lcg)
    s = mx.zeros((B, Hv, Dv, Dk), mx.float32) if state is None else state.astype(mx.float32)
    ys = []
    for c in range(n):
        st = mx.swapaxes(s, -1, -2)
        ys.append(mu[:, :, c] + qeff[:, :, c] @ st)
        scaled = ratio[:, :, c][..., None] * (u[:, :, c] - kt[:, :, c] @ st)
        s = last[:, :, c][..., None, None] * s + mx.swapaxes(scaled, -1, -2) @ k[:, :, c]
    y = mx.stack(ys, axis=2).transpose(0, 2, 3, 1, 4).reshape(B, n * C, Hv, Dv)[:, :T]
    return y.astype(in_dtype), s
