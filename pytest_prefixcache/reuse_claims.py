"""What an engine said about one request, part of the adapter protocol (``Outcome.claims``):
its reuse figures (:class:`Claim`) and the API's distribution for each decode step
(:class:`StepEntry`), next to what its model computed (:class:`Claims`). Importable from
``pytest_prefixcache.types`` too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["Claim", "ClaimUnit", "Claims", "StepEntry"]


#: What a reuse figure counts: ``"tokens"`` prompt tokens reused; ``"hits"`` cache hits (more
#: than 0 says something was reused); ``"misses"`` cache misses (more than 0 says nothing was).
ClaimUnit = Literal["tokens", "hits", "misses"]


@dataclass(frozen=True)
class Claim:
    """One reuse figure an engine reported for one request, and where it came from.

    Attributes:
        source: the source, in words (``"stats GET /v1/cache/stats hits (delta)"``).
        unit: what the figure counts (:data:`ClaimUnit`).
        value: the figure, or None when the source said nothing about this request.
        raw: the text the figure was read from.
    """

    source: str
    unit: ClaimUnit
    value: int | None
    raw: str


@dataclass(frozen=True)
class StepEntry:
    """One entry of the API's distribution for a decode step: its logprob, the token id when
    the entry names one that can be told, and the raw token text or bytes as reported."""

    logprob: float
    token_id: int | None = None
    text: str = ""


@dataclass(frozen=True, eq=False)
class Claims:
    """What an engine said about one request next to what its model computed (the claims check).

    Attributes:
        reuse: one :class:`Claim` per declared claim source.
        steps: the API's distribution for each decode step (``logprobs.content[i]``), or None
            when the reply carried no per-step logprobs.
        reused: prompt tokens the model did not prefill (its KV offset before the prefill, as
            the logit tap saw it), or None when nothing observed the model.
        prompt_tokens: the prompt's length.
        computed_steps: the model's log-softmax before each generated token (the tap), or None
            when nothing observed the model.
    """

    reuse: tuple[Claim, ...] = ()
    steps: tuple[tuple[StepEntry, ...], ...] | None = None
    reused: int | None = None
    prompt_tokens: int | None = None
    computed_steps: tuple[np.ndarray, ...] | None = None
