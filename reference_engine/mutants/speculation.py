"""Mutants of the reference engine's speculative mode (``speculative.py``): class 26 of the bug
zoo, speculative decoding that leaves a rejected draft's state behind."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..engine import Engine
from ..fixtures.draft import draft_dir
from ..model import LoadedModel, shared_model
from ..speculative import Speculative

__all__ = ["RecurrentNotRolledBack", "RejectedDraftKept", "draft_for"]

#: Drafts per round of the speculative mutants.
NUM_DRAFT = 3


def draft_for(model: LoadedModel, num_draft: int = NUM_DRAFT) -> Speculative:
    """The draft fixture built beside ``model``'s directory (``<name>-draft``)."""
    path = Path(model.path)
    return Speculative(shared_model(path.parent / draft_dir(path.name)), num_draft)


class RejectedDraftKept(Engine):
    """Class 26, speculative decoding leaves state behind: the last verification round is not
    rewound, so the rows of the drafts the target rejected stay in the cache, and the
    prompt+output design stores them under the reply's tokens: the row of the first rejected
    draft under the key of the token the target emitted in its place, the reply's last. The
    engine declares, as a plain mlx-lm ``generate_step`` decode may, that its decode computed
    the last token's KV (``last_token_kv``): after speculation it did not.

    The request itself decodes right (its tokens come from the verification's logits); the
    next turn that carries the reply reuses the rejected draft's KV and its logits move.
    Reproduces vLLM #43559, #45477, #57128 and SGLang #19897 (a cache hit after speculation
    changes or breaks the answer).
    """

    def __init__(self, model: LoadedModel, **options: Any) -> None:
        if options.get("cache_output") is None:  # the design whose store shows it
            options["cache_output"] = True
        if options.get("speculative") is None:
            options["speculative"] = draft_for(model)
        super().__init__(model, **options)
        self.last_token_kv = True

    def rewind(self, cache: list[Any], rows: int, *, last: bool) -> None:
        if last:  # BUG: the final round's rejected drafts are not trimmed
            return
        super().rewind(cache, rows, last=last)


class RecurrentNotRolledBack(Engine):
    """Class 26 on a hybrid model: after the target rejects a draft, the attention layers'
    rejected rows are trimmed but the recurrent (GatedDeltaNet) states keep the updates of
    every draft the verification computed, rejected ones included.

    Every later token of the reply is computed from a state that has seen tokens the reply
    does not hold: the speculative decode stops agreeing with plain greedy decoding, which is
    what the verifier's cold run is. Reproduces vLLM #43559, #45477 and #57128 (a hybrid with
    speculative decoding and the prefix cache loses accuracy).
    """

    def __init__(self, model: LoadedModel, **options: Any) -> None:
        if options.get("speculative") is None:
            options["speculative"] = draft_for(model)
        super().__init__(model, **options)

    def roll_back(
        self, cache: list[Any], saved: dict[int, Any], kept: Sequence[int], position: int
    ) -> None:
        return  # BUG: the recurrent states stay advanced over the rejected drafts
