"""Speculative decoding in the reference engine: greedy draft-then-verify (mlx-lm's scheme).

mlx-lm's ``speculative_generate_step`` (generate.py): the draft model proposes ``k`` tokens one
at a time on its own cache; the target computes the last accepted token and the ``k`` drafts in
one forward, and keeps the drafts up to the first one its own greedy choice disagrees with, then
its own token there (or, all accepted, the one after the last draft). The rejected drafts' KV
rows are then cut off both caches (``trim_prompt_cache``); the target's cache ends every round
holding the KV of every emitted token but the last, exactly what a one-token-at-a-time greedy
decode leaves (:meth:`~reference_engine.model.LoadedModel.greedy`).

So speculation changes nothing a client sees (greedy tokens, the logits before each of them), and
nothing the cache stores: with ``prompt+output`` the engine stores the rows its decode computed
(:meth:`Speculate.store_decoded`), and after a correct rewind those are the prompt and every output
token but the last. A rewind that keeps a rejected draft's row stores it under the reply's token
(bug-zoo class 26; the mutant ``rejected-draft-kept``).

Selected by ``Engine(speculative=Speculative(...))`` or the environment:
``PREFIXCACHE_REFERENCE_DRAFT`` (a draft model directory sharing the target's tokenizer, e.g.
``fixtures/tiny-qwen2-vl-draft``) and ``PREFIXCACHE_REFERENCE_DRAFT_TOKENS`` (drafts per round,
default 3). On a hybrid (recurrent layers, Qwen3.5), a rejection also rolls the recurrent states
back: they are kept before each verification (:meth:`Speculate.save_states`), restored, and the
kept tokens computed again (:meth:`Speculate.roll_back`; mutant ``recurrent_not_rolled_back``).
Sliding-window models are refused (a wrapped ring cannot trim); so is a draft whose tokenizer
differs from the target's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from pytest_prefixcache.errors import EngineError
from pytest_prefixcache.types import Request

from .blocks import BlockKey, KeyChain
from .families import RECURRENT
from .model import LoadedModel, load_model
from .recurrent import sequential_pieces
from .render import Rendered

__all__ = [
    "DRAFT_ENV",
    "DRAFT_TOKENS_ENV",
    "Speculate",
    "Speculative",
    "speculative_from_env",
]

DRAFT_ENV = "PREFIXCACHE_REFERENCE_DRAFT"
DRAFT_TOKENS_ENV = "PREFIXCACHE_REFERENCE_DRAFT_TOKENS"


@dataclass
class Speculative:
    """A draft model and how many tokens it proposes per round; counts what happened.

    Args:
        draft: the draft model (same tokenizer and vocab as the target).
        num_draft: tokens proposed per round. Default: ``3``.
    """

    draft: LoadedModel
    num_draft: int = 3
    accepted: int = field(default=0, init=False)
    rejected: int = field(default=0, init=False)
    rounds: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.num_draft, int) or self.num_draft < 1:
            raise EngineError(f"num_draft must be a positive int, got {self.num_draft!r}")


def speculative_from_env(target: LoadedModel) -> Speculative | None:
    """The draft ``PREFIXCACHE_REFERENCE_DRAFT`` names (unset or empty: no speculation)."""
    path = os.environ.get(DRAFT_ENV, "").strip()
    if not path:
        return None
    raw = os.environ.get(DRAFT_TOKENS_ENV, "3").strip() or "3"
    try:
        k = int(raw)
    except ValueError:
        raise EngineError(f"{DRAFT_TOKENS_ENV}={raw!r} is not an int") from None
    if k < 1:
        raise EngineError(f"{DRAFT_TOKENS_ENV}={raw!r} must be at least 1")
    return checked(Speculative(load_model(path), k), target)


def checked(spec: Speculative, target: LoadedModel) -> Speculative:
    """``spec`` if its draft can serve ``target``; else an EngineError naming the mismatch."""
    windows = [i for i in target.stateful_layers if target.kinds[i] != RECURRENT]
    if windows:
        raise EngineError(
            f"speculative decoding needs full-attention or recurrent layers; {target.path} "
            f"has {len(windows)} sliding-window layers"
        )
    vt, vd = len(target.tokenizer), len(spec.draft.tokenizer)
    if vt != vd:
        raise EngineError(
            f"draft {spec.draft.path} has a tokenizer of {vd} tokens, the target {vt}"
        )
    return spec


def _positions(model: LoadedModel, first: int, n: int) -> mx.array | None:
    steps = [model.family.step_positions(first + j) for j in range(n)]
    return None if steps[0] is None else mx.concatenate(steps, axis=-1)


def _all_logits(
    model: LoadedModel, tokens: Sequence[int], cache: list[Any], positions: mx.array | None
) -> mx.array:
    """Float32 logits of every position of ``tokens`` computed on top of ``cache``."""
    extra = {} if positions is None else {"position_ids": positions}
    # a verification's positions run the recurrence one position at a time, as the greedy
    # decode's single-position steps do, so that speculating answers bit for bit as greedy
    limit, chunk = model.piece_choice
    with sequential_pieces(max(limit, len(tokens)) if chunk else 0, chunk):
        out = model.model.language_model(
            mx.array([list(tokens)]),
            inputs_embeds=model.embed(tokens)[None],
            cache=cache,
            **extra,
        )
    logits = out.logits[0].astype(mx.float32)
    mx.eval(logits)
    return logits


def _offset(cache: list[Any]) -> int:
    """Positions in ``cache``: the first layer that counts them (a recurrent layer does not)."""
    return int(next(c.offset for c in cache if hasattr(c, "offset")))


def _trim(cache: list[Any], n: int) -> None:
    """Cut the last ``n`` rows of every layer that trims (recurrent layers are rolled back)."""
    if n > 0:
        for c in cache:
            if hasattr(c, "trim") and c.is_trimmable():
                c.trim(n)


class Speculate:
    """The engine's speculative decode (a part of :class:`~reference_engine.engine.Engine`)."""

    model: LoadedModel
    speculative: Speculative | None
    block_size: int

    if TYPE_CHECKING:

        def root(self, namespace: str, adapter: str | None = None) -> bytes: ...

        def store(self, cache: list[Any], keys: Sequence[BlockKey], first: int) -> None: ...

    def speculate(
        self,
        logits: mx.array,
        cache: list[Any],
        ids: Sequence[int],
        delta: int,
        max_new: int,
        between: Callable[[], object] | None = None,
    ) -> tuple[tuple[int, ...], list[np.ndarray]]:
        """Greedy continuation by draft-then-verify; the same tokens and steps as ``greedy``."""
        spec = self.speculative
        assert spec is not None
        target, draft = self.model, spec.draft
        steps = [np.array(logits)]
        if max_new <= 0:
            return (), steps
        tokens = [int(np.argmax(steps[0]))]
        eos = target.eos_token_ids
        if tokens[0] in eos or max_new <= 1:
            return tuple(tokens), steps
        dcache = draft.make_cache()
        seq = list(ids) + tokens
        while True:
            if between is not None:
                between()
            k = min(spec.num_draft, max_new - len(tokens))
            # the draft catches up on what it has not seen (at least the last token), proposes k
            _trim(dcache, _offset(dcache) - min(_offset(dcache), len(seq) - 1))
            feed = seq[_offset(dcache) :]
            drafts: list[int] = []
            for _ in range(k):
                pos = _positions(draft, _offset(dcache) + delta, len(feed))
                drafts.append(int(np.argmax(np.array(_all_logits(draft, feed, dcache, pos)[-1]))))
                feed = drafts[-1:]
            # the target verifies the last token and the drafts in one forward
            q = _offset(cache)
            saved = self.save_states(cache)
            verify = _all_logits(
                target, [seq[-1], *drafts], cache, _positions(target, q + delta, k + 1)
            )
            spec.rounds += 1
            n = 0
            done = False
            for i in range(k + 1):
                steps.append(np.array(verify[i]))
                tokens.append(int(np.argmax(steps[-1])))
                done = tokens[-1] in eos or len(tokens) == max_new
                if i == k:
                    break
                if tokens[-1] != drafts[i]:
                    spec.rejected += k - i
                    break
                n += 1
                if done:
                    break
            spec.accepted += n
            seq = list(ids) + tokens
            self.rewind(cache, len(seq) - 1, last=done)
            if saved and _offset(cache) < q + k + 1:  # drafts rejected: the states too
                self.roll_back(cache, saved, seq[q : _offset(cache)], q + delta)
            if done:
                return tuple(tokens), steps

    def rewind(self, cache: list[Any], rows: int, *, last: bool) -> None:
        """Cut the target's cache back to ``rows`` (the KV of every emitted token but the
        last): the rejected drafts' rows go, on the last round too."""
        _trim(cache, _offset(cache) - rows)

    def save_states(self, cache: list[Any]) -> dict[int, Any]:
        """The recurrent layers' states before a verification (MLX arrays are immutable:
        holding them is a copy)."""
        kinds = self.model.kinds
        return {i: list(cache[i].state) for i in range(len(cache)) if kinds[i] == RECURRENT}

    def roll_back(
        self, cache: list[Any], saved: dict[int, Any], kept: Sequence[int], position: int
    ) -> None:
        """After a rejection on a hybrid: the recurrent states back to before the verification,
        the attention rows cut to there too, then the kept tokens (the last token and the
        accepted drafts) computed again, so every layer holds exactly them."""
        for i, state in saved.items():
            cache[i].state = state
        _trim(cache, len(kept))
        _all_logits(self.model, kept, cache, _positions(self.model, position, len(kept)))

    def store_decoded(
        self, cache: list[Any], rendered: Rendered, request: Request, tokens: Sequence[int]
    ) -> None:
        """The prompt+output design after a speculative decode: store the rows the decode
        left in the cache (``cache``'s offset past the prompt, at most one per output token)
        under the prompt and those output tokens. After a correct rewind that is every output
        token but the last, as ``store_output`` stores after a plain decode."""
        prompt = len(rendered.token_ids)
        n = min(len(tokens), _offset(cache) - prompt)
        if n < 1:
            return
        ids = (*rendered.token_ids, *tokens[:n])
        root = self.root(request.namespace, request.adapter)
        keys = KeyChain(ids, rendered.spans, block_size=self.block_size, root=root)
        self.store(cache, keys, prompt // self.block_size)
