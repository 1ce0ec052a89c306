"""Mutants of the vision merge: class 2 of the bug zoo (a match that ends inside an image).

Both override only ``Engine.suffix_embeddings``, and reuse whole blocks only
(``partial_blocks = False``, as the block-granular caches of the reproduced issues do; the
token-granular reference engine stops a match at an image's start unless the image is the
same). When the reused prefix ends inside an image's placeholder run, only the rows of the
placeholders after the boundary must be merged; these mutants merge all rows of the partly
cached image.
"""

from __future__ import annotations

import mlx.core as mx

from ..engine import Engine
from ..render import Rendered
from ..vision import Prepared, merge_rows

__all__ = ["PartialImageCrash", "PartialImageMerge"]


class PartialImageMerge(Engine):
    """Class 2, match ends inside an image span: every row of a partly cached image is
    merged into the slots that are left.

    The vision tower yields N rows for M < N remaining placeholder slots; like a masked
    scatter, the merge fills the M slots with the image's FIRST M rows (those of the cached
    placeholders) and drops the rest, and records ``(M, N)``: slots != rows, and the logits
    are wrong. Reproduces ROCm/ATOM #1358, NVIDIA/TensorRT-LLM #14125 and sglang #36595
    (``shape mismatch [64,2048] vs [4,2048]``), where the same mismatch killed the runner.
    """

    crash = False
    partial_blocks = False  # a block-granular cache: reuse can end inside an image span

    def suffix_embeddings(
        self, rendered: Rendered, prepared: dict[str, Prepared], start: int, *, use_cache: bool
    ) -> tuple[mx.array, list[tuple[int, int]]]:
        placed: list[tuple[int, int, mx.array]] = []
        merges: list[tuple[int, int]] = []
        for (span_start, span_end, _digest), image in zip(rendered.spans, rendered.images):
            if span_end <= start:
                continue
            # BUG: all rows of the image, even when its first placeholders are cached.
            rows = self.vision.rows(image, prepared[image.digest], use_cache=use_cache)
            first = max(span_start, start)
            slots = span_end - first
            merges.append((slots, int(rows.shape[0])))
            if slots != rows.shape[0] and self.crash:
                raise ValueError(
                    f"shape mismatch: [{rows.shape[0]}, {rows.shape[1]}] rows for "
                    f"[{slots}, {rows.shape[1]}] placeholder slots"
                )
            placed.append((first, span_end, rows[:slots]))  # masked scatter: first rows win
        return merge_rows(self.model.embed(rendered.token_ids[start:]), start, placed), merges


class PartialImageCrash(PartialImageMerge):
    """Class 2, the crashing variant: the same full-image merge raises the shape mismatch
    (``ValueError``); the plugin must report a fault with the replayable stream, never hang.

    Reproduces the dead model runner of ROCm/ATOM #1358 and sglang #36595 (``/health`` kept
    answering 200 while every request stalled).
    """

    crash = True
