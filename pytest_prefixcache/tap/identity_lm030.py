"""Row labels for mlx-lm's first ``BatchGenerator`` (0.30.x to 0.31.1), before it was split into
prompt and generation batches (0.31.2: :mod:`.identity`'s hooks).

What that scheduler holds, read in the 0.30.2, 0.30.4, 0.31.0 and 0.31.1 wheels
(``mlx_lm/generate.py``): ``BatchGenerator.insert(prompts, ...)`` hands each prompt a uid and
returns them; ``_process_prompts(prompts)`` takes ``(uid, tokens, ...)`` tuples and prefills
them as one batch in their order (its forward calls, and the ``_step`` that samples their
first tokens, run on those rows); ``_next`` then extends ``active_batch`` (a ``Batch`` whose
``uids`` are in row order, kept in order by ``filter`` and ``extend``) and runs one ``_step``
on it. ``mlx_lm.server`` tokenizes a request (``ResponseGenerator._tokenize``) just before it
inserts it, on the same thread, as later versions do: :mod:`.identity`'s HTTP hooks tie the
uid to the reply's id.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ._labels import Make, patch_plan
from ._labels import local as _local
from ._labels import row_label as _row_label

__all__ = ["old_batch_generator_hooks"]


def _prompting(original: Callable[..., Any]) -> Callable[..., Any]:
    """``BatchGenerator._process_prompts(prompts)``: its forward calls (and the ``_step``
    inside it) run on the rows of ``prompts``' uids, in that order."""

    def run(self: Any, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        before = getattr(_local, "labels", None), getattr(_local, "prompt_uids", None)
        try:
            uids = [p[0] for p in prompts]
            gen = getattr(_local, "generator", 0)
            _local.labels, _local.prompt_uids = [_row_label(gen, u) for u in uids], uids
        except Exception:
            _local.labels, _local.prompt_uids = None, None
        try:
            return original(self, prompts, *args, **kwargs)
        finally:
            _local.labels, _local.prompt_uids = before

    return run


def _stepping(original: Callable[..., Any]) -> Callable[..., Any]:
    """``BatchGenerator._step(input_tokens, prompt_cache, ...)``: inside ``_process_prompts``
    the prompts' rows, else ``active_batch``'s."""

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = getattr(_local, "labels", None)
        try:
            uids = getattr(_local, "prompt_uids", None)
            if uids is None:
                uids = self.active_batch.uids
            gen = getattr(_local, "generator", 0)
            _local.labels = [_row_label(gen, u) for u in uids]
        except Exception:
            _local.labels = None
        try:
            return original(self, *args, **kwargs)
        finally:
            _local.labels = before

    return run


def old_batch_generator_hooks(admitting: Make) -> list[str]:
    """Patch the first BatchGenerator's methods when ``mlx_lm.generate`` is that version (it
    has no ``PromptProcessingBatch``); ``admitting`` wraps ``insert`` (it returns the uids).
    Returns what was patched."""
    module = sys.modules.get("mlx_lm.generate")
    if module is None or hasattr(module, "PromptProcessingBatch"):
        return []
    gen = "mlx_lm.generate"
    return patch_plan(
        [
            (gen, "BatchGenerator", "_process_prompts", _prompting),
            (gen, "BatchGenerator", "_step", _stepping),
            (gen, "BatchGenerator", "insert", admitting),
        ]
    )
