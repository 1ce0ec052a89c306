"""Where a prefill cuts on a model with non-trimmable layers, with a prefill step (chunked
prefill, issue #35 item 4).

A server that prefills in chunks of ``step`` positions (mlx_lm.server ``--prefill-step-size``,
vllm-mlx ``--chunked-prefill-tokens``, vLLM ``--max-num-batched-tokens``) and keeps recurrent
snapshots at boundaries must split a chunk where a boundary falls inside it: a recurrent state
exists only at the end of a piece, so the state after boundary ``b`` is the state after the
piece that ends at ``b``, not after the chunk around it (vLLM #51113, #54076, #57278 stored it
under the chunk's end). The reference engine's prefill cuts at every boundary and, given a
step, at every multiple of it too, in absolute positions: a cold run and a warm one resuming
at a boundary then cut at the same points past it, so they stay bit-exact.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["chunk_ends", "prefill_cuts"]


def chunk_ends(start: int, end: int, step: int | None) -> list[int]:
    """The multiples of ``step`` in (start, end) (none without a step)."""
    if step is None:
        return []
    return list(range((start // step + 1) * step, end, step))


def prefill_cuts(
    boundaries: Sequence[int], start: int, end: int, step: int | None = None
) -> list[int]:
    """Where a prefill of positions [start, end) cuts, relative to ``start``: every boundary
    past ``start`` and every chunk end, in order."""
    cuts = {b for b in boundaries if start < b} | set(chunk_ends(start, end, step))
    return sorted(c - start for c in cuts)
