"""Hypothesis strategies for concurrent traffic: waves of requests in flight together.

A wave is K requests sent to an engine at once or a few milliseconds apart; the next wave
starts when every reply of the previous one is in. The requests of a wave share what real
concurrent clients share: a system prompt, earlier turns, images, sometimes the whole
prompt (duplicates), within one namespace and across namespaces. Each request is made by
one of the stream moves (:mod:`pytest_prefixcache.strategies._moves`) from the requests
before it, in this wave or an earlier one, so later waves read what earlier ones stored.

A wave is ragged on purpose: its rows have prompts of different lengths and ask for
different numbers of new tokens, so that in a batching engine rows join while others decode
and leave before them. At least half of a wave's requests decode (ask for 2 or more new
tokens: every token after the first comes from a decode step, where a batch's rows of
different lengths must each keep their own positions); the others ask for 0 or 1.

The arrival patterns (:data:`ARRIVALS`):

- ``"together"``: every request at offset 0 (one batch, if the engine batches);
- ``"staggered"``: each request a drawn 0 to ``max_stagger_ms`` milliseconds after the one
  before (a request arrives while the previous one is still prefilling or decoding);
- ``"long_first"``: a long conversation (several turns) that decodes the most tokens first,
  short requests right after it (they join its batch mid-decode and leave before it);
- ``"duplicates"``: copies of the same requests (the same prefix written by two requests
  in flight).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ..types import Image, Request, Wave
from ._args import int_arg, range_arg, stream_spec, usable_moves
from ._images import pool_strategy
from ._moves import MOVES, StreamSpec, apply_move, new_conversation

__all__ = ["ARRIVALS", "request_waves"]

#: Arrival patterns; the first is the simplest, so waves shrink toward it.
ARRIVALS = ("together", "staggered", "long_first", "duplicates")
#: Moves that make a wave's requests share prefixes; "new" and "namespace" add variety.
SHARING = ("repeat", "append", "new", "edit", "replace", "swap", "reencode", "namespace", "adapter")
#: A wave goes on after each wave with odds MORE_WAVES : 1 (until max_waves).
MORE_WAVES = 2


def _long(draw: st.DrawFn, pool: Sequence[Image], spec: StreamSpec, ns: str) -> Request:
    turns = draw(st.integers(2, 5))
    return Request(new_conversation(draw, pool, spec, turns), ns, spec.max_new_tokens)


def _ragged(
    draw: st.DrawFn, request: Request, spec: StreamSpec, decoding: int, done: int
) -> Request:
    """``request`` with its own count of new tokens: 2 to ``max_new_tokens`` (it decodes)
    when fewer than half of the wave would decode otherwise, or when drawn so, else 0 or 1.
    ``decoding`` of the ``done`` requests before it decode. Shrinks toward 2 and 0."""
    top = spec.max_new_tokens
    if top < 2:
        return request
    if 2 * decoding < done + 1 or draw(st.booleans()):
        n = draw(st.integers(2, top))
    else:
        n = draw(st.integers(0, 1))
    return Request(request.messages, request.namespace, n, request.adapter)


def _wave(
    draw: st.DrawFn,
    size: int,
    pattern: str,
    history: list[Request],
    pool: Sequence[Image],
    spec: StreamSpec,
    moves: tuple[str, ...],
    max_stagger_ms: int,
) -> Wave:
    requests: list[Request] = []
    if pattern == "long_first":
        requests.append(_long(draw, pool, spec, draw(st.sampled_from(spec.namespaces))))
    while len(requests) < size:
        earlier = [*history, *requests]
        decoding = sum(r.max_new_tokens >= 2 for r in requests)
        if pattern == "duplicates" and requests and draw(st.booleans()):
            copy = requests[draw(st.integers(0, len(requests) - 1))]
            if copy.max_new_tokens < 2 <= spec.max_new_tokens and 2 * decoding < len(requests) + 1:
                copy = Request(copy.messages, copy.namespace, 2, copy.adapter)  # it decodes
            requests.append(copy)
            continue
        move = draw(st.sampled_from(moves)) if earlier else "new"
        made = apply_move(draw, move, earlier, pool, spec)
        requests.append(_ragged(draw, made, spec, decoding, len(requests)))
    if pattern in ("staggered", "long_first") and max_stagger_ms:
        gaps = [draw(st.integers(0, max_stagger_ms)) for _ in requests[1:]]
        offsets = [sum(gaps[:i]) for i in range(len(requests))]
    else:
        offsets = [0] * len(requests)
    return Wave(tuple(requests), tuple(ms / 1000 for ms in offsets))


def request_waves(
    *,
    min_waves: int = 1,
    max_waves: int = 3,
    min_size: int = 2,
    max_size: int = 8,
    namespaces: Sequence[str] = ("", "tenant-b"),
    max_new_tokens: int = 6,
    max_images_per_message: int = 2,
    pool: Sequence[Image] | st.SearchStrategy[tuple[Image, ...]] | None = None,
    moves: Sequence[str] = SHARING,
    arrivals: Sequence[str] = ARRIVALS,
    max_stagger_ms: int = 20,
    adapters: Sequence[str] = (),
) -> st.SearchStrategy[tuple[Wave, ...]]:
    """Tuples of waves of concurrent requests that share system prompts, turns and images.

    Args:
        min_waves, max_waves: how many waves, one after the other. Default: 1 and 3.
        min_size, max_size: requests in flight in one wave (K). Default: 2 and 8.
        namespaces: namespaces to use; the first is the default. Default: ``("", "tenant-b")``.
        max_new_tokens: largest greedy continuation per request; at least half of each
            wave's requests ask for 2 to this many (they decode) when it is 2 or more, the
            others for 0 or 1. Default: 6.
        max_images_per_message: most images in one user turn. Default: 2.
        pool: the images (sequence or strategy of tuples). Default: ``image_pools()``.
        moves: the stream moves a wave's requests are made by. Default: all of them.
        arrivals: the arrival patterns to draw from (:data:`ARRIVALS`). Default: all four.
        max_stagger_ms: largest gap between two staggered arrivals, in ms. Default: 20.
        adapters: adapter names requests may carry besides none. Default: none.

    Shrinks toward ``min_waves`` waves of ``min_size`` requests arriving together, exact
    repeats of one short text conversation, the first namespace, and every other request
    decoding 2 tokens (the rest none).
    """
    int_arg("min_waves", min_waves, 1, 16)
    int_arg("max_waves", max_waves, 1, 16)
    range_arg("min_waves", min_waves, "max_waves", max_waves)
    int_arg("min_size", min_size, 1, 64)
    int_arg("max_size", max_size, 1, 64)
    range_arg("min_size", min_size, "max_size", max_size)
    int_arg("max_stagger_ms", max_stagger_ms, 0, 1000)
    spec = stream_spec(namespaces, max_new_tokens, max_images_per_message, adapters)
    mv = usable_moves(moves, spec, MOVES)
    pats = (arrivals,) if isinstance(arrivals, str) else tuple(arrivals)
    if not pats or any(p not in ARRIVALS for p in pats):
        raise InvalidArgument(f"arrivals={arrivals!r} must be a non-empty subset of {ARRIVALS}")
    pools = pool_strategy(pool)
    # Conversations go on wave after wave: draw "append" twice as often (as request_streams).
    weighted = (*mv, "append") if "append" in mv and len(mv) > 1 else mv

    @st.composite
    def build(draw: st.DrawFn) -> tuple[Wave, ...]:
        imgs = draw(pools)
        history: list[Request] = []
        waves: list[Wave] = []
        while len(waves) < max_waves:
            # One "more?" draw per wave (like st.lists), so shrinking deletes waves.
            if len(waves) >= min_waves and not draw(st.integers(0, MORE_WAVES)):
                break
            size = draw(st.integers(min_size, max_size))
            pattern = draw(st.sampled_from(pats))
            wave = _wave(draw, size, pattern, history, imgs, spec, weighted, max_stagger_ms)
            waves.append(wave)
            history.extend(wave.requests)
        return tuple(waves)

    return build()
