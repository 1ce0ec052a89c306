"""The model runner for a scheduler that hands it a batch object (ATOM's interface).

ATOM's engine core runs, per step (``atom/model_engine/engine_core.py``)::

    batch, seqs = scheduler.schedule()            # None when nothing is left
    out = model_runner.forward(batch)             # a ScheduledBatchOutput
    scheduler.postprocess(seqs.values(), out, stream_output_queue=..., batch=batch)

Whatever the scheduler does between those calls is its own: the batch it builds from its
sequences (and what building it clears on them: ATOM's ``ScheduledBatch`` moves each
sequence's ``multimodal_data`` into the batch and sets it to None), its post-processing (the
chunk's blocks hashed, ``num_cached_tokens`` advanced, the token appended, a finished
sequence's blocks freed). :class:`BatchRunner` is the model runner only, and reads what
ATOM's runner reads, from the batch, never from the sequence: the row's request id
(``req_ids``), its token count (``num_scheduled_tokens``), its first position
(``num_cached_tokens`` for a prefill row, ``context_lens`` minus the count for a decode row;
prefill rows come first, ``total_seqs_num_prefill`` of them), the tokens it is fed
(``scheduled_tokens``), its block table (``block_tables``), and whether the images of the row
travel with it (``multimodal_data``, keyed by request id). A prefill chunk whose batch carries
no image data for its row embeds its placeholders as plain tokens, as the runner's text path
does.

Outputs are deferred, as ATOM's runner defers them with one pipeline stage (its default,
``TokenIDProcessor.is_deferred_out``): each forward answers with the tokens the *previous*
forward sampled (``is_deferred_out=True``), and a decode row whose request was in that
previous forward is fed the token sampled there, not the batch's placeholder; a batch whose
``produces_output()`` is False (ATOM main: prefill chunks that do not end a prompt) answers
with its request ids and no tokens, and is not a previous forward. A chunk that does not end
the prompt samples ``0`` (ATOM samples there too; its post-processing drops it).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from pytest_prefixcache.errors import EngineError

__all__ = ["BatchRunner", "BatchStep"]

#: The model's step on one row: (sequence, first position, end position, is_prefill,
#: table=, tokens=, images=) -> the greedy token after ``end`` (None mid-prompt).
BatchStep = Callable[..., "int | None"]


def _output_class(scheduler: Any) -> Callable[..., Any]:
    """The ``ScheduledBatchOutput`` of the module that defines the scheduler's class."""
    home = sys.modules.get(type(scheduler).__module__)
    cls = getattr(home, "ScheduledBatchOutput", None)
    if not callable(cls):
        raise EngineError(
            f"{type(scheduler).__qualname__}.schedule() returned a batch object, but "
            f"{type(scheduler).__module__!r} has no ScheduledBatchOutput to answer it with"
        )
    return cls


class BatchRunner:
    """One engine's model runner: the previous forward's requests and sampled tokens."""

    def __init__(self) -> None:
        self.prev_rows: list[Any] = []
        self.prev_tokens: list[tuple[int, ...]] = []

    def run(
        self,
        result: tuple[Any, dict[Any, Any]],
        seq: Any,
        step: BatchStep,
        *,
        scheduler: Any,
        stop: Callable[[int, int], None],
    ) -> int | None:
        """Run the model on ``result`` (``schedule()``'s batch and its sequences) and hand the
        output to the scheduler's ``postprocess``; return the prefill's first position when
        the batch was a prefill (the tokens the block manager found cached), else None."""
        batch, seqs = result
        rows = list(batch.req_ids)
        if not rows:
            return None  # ATOM's engine core skips the forward and the post-processing
        if rows != [seq.id]:
            raise EngineError(
                f"the scheduler's batch holds requests {rows}, not the one added ({seq.id!r})"
            )
        n = int(batch.num_scheduled_tokens[0])
        prefill = int(batch.total_seqs_num_prefill) > 0
        start = int(batch.num_cached_tokens[0]) if prefill else int(batch.context_lens[0]) - n
        tokens = [int(t) for t in batch.scheduled_tokens[:n]]
        if not prefill and seq.id in self.prev_rows:  # the token sampled last forward
            tokens = list(self.prev_tokens[self.prev_rows.index(seq.id)])[-n:]
        tables = [list(t) for t in batch.block_tables]
        if len(tables) != 1:
            raise EngineError(f"a batch of one request carries {len(tables)} block tables")
        images = seq.id in (getattr(batch, "multimodal_data", None) or {})
        token = step(seq, start, start + n, prefill, table=tables[0], tokens=tokens, images=images)
        if token is not None:
            stop(token, start + n)
        output = _output_class(scheduler)
        produces = getattr(batch, "produces_output", None)
        if produces is not None and not produces():
            out = output(
                req_ids=rows, token_ids=[], num_rejected=None, num_bonus=None,
                draft_token_ids=None,
            )  # fmt: skip
        else:
            k = len(self.prev_rows)
            out = output(
                req_ids=self.prev_rows,
                token_ids=self.prev_tokens,
                num_rejected=np.zeros(k, dtype=np.int32),
                num_bonus=np.zeros(k, dtype=np.int32),
                draft_token_ids=None,
                is_deferred_out=True,
            )
            self.prev_rows, self.prev_tokens = rows, [(0 if token is None else token,)]
        postprocess = scheduler.postprocess
        if "batch" in inspect.signature(postprocess).parameters:
            postprocess(list(seqs.values()), out, batch=batch)
        else:
            postprocess(list(seqs.values()), out)
        return start if prefill else None
