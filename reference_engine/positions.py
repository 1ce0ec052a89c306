"""M-RoPE position ids of a Qwen2-VL prompt, computed with numpy.

Qwen2-VL gives text positions one index for all three rotary sections (temporal, height,
width) and an image's placeholder run a 3-D grid: (t, h // merge, w // merge) indices offset
by the position the run starts at; the text after an image continues from the largest index
used so far plus one. The rope delta (largest index + 1 - prompt length) shifts the decode
positions.

mlx-vlm's ``get_rope_index`` computes the same ids with Python lists over the whole prompt, a
cost every warm run pays however much of the prompt it reuses; this computes them with numpy
operations over whole runs of positions (the timings of both: README, "Benchmark: cold vs warm
prefill", ``benchmarks/profile_warm.py --prefill-pair 5``). ``tests/test_positions.py`` checks
that both agree on generated prompts, the bit-exactness tests that a warm run still equals a
cold one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["mrope_positions"]


def mrope_positions(
    token_ids: Sequence[int],
    grids: Sequence[tuple[int, int, int]],
    *,
    image_token_id: int,
    merge_size: int,
) -> tuple[np.ndarray, int]:
    """Position ids (3, L) int32 of a prompt whose image placeholder runs are given in order
    by their patch grids (t, h, w), and the rope delta."""
    ids = np.asarray(token_ids, dtype=np.int64)
    n = len(ids)
    out = np.empty((3, n), dtype=np.int64)
    image_at = np.flatnonzero(ids == image_token_id)
    st = 0  # next position of the prompt to assign
    nxt = 0  # next free index
    for t, h, w in grids:
        later = image_at[np.searchsorted(image_at, st) :]
        if not len(later):
            raise ValueError(f"{len(grids)} image grids but no placeholder after position {st}")
        ed = int(later[0])
        out[:, st:ed] = np.arange(nxt, nxt + ed - st)
        gh, gw = h // merge_size, w // merge_size
        count = t * gh * gw
        if ed + count > n:
            raise ValueError(f"an image of {count} placeholders at {ed} overruns {n} tokens")
        base = nxt + ed - st
        out[0, ed : ed + count] = base + np.repeat(np.arange(t), gh * gw)
        out[1, ed : ed + count] = base + np.tile(np.repeat(np.arange(gh), gw), t)
        out[2, ed : ed + count] = base + np.tile(np.arange(gw), t * gh)
        nxt = base + max(t, gh, gw)
        st = ed + count
    out[:, st:] = np.arange(nxt, nxt + n - st)
    top = nxt + n - st - 1 if st < n else nxt - 1
    return out.astype(np.int32), (top + 1 - n if grids else 0)
