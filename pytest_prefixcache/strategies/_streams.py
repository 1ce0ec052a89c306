"""Strategies for conversations and request streams (one request after another)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ..types import Image, Message, Request
from ._args import int_arg, range_arg, stream_spec, usable_moves
from ._images import pool_strategy
from ._moves import MOVES, apply_move, close_loop, new_conversation, reply_back

__all__ = ["CLOSED_LOOP_SHARE", "conversations", "request_streams"]

#: A stream goes on after each request with odds CONTINUE_ODDS : 1 (until max_requests).
CONTINUE_ODDS = 5
#: The share of streams ``--prefixcache-verify`` generates closed-loop (the engine's own
#: replies sent back as the next assistant turns; ``request_streams(closed_loop=...)``).
CLOSED_LOOP_SHARE = 0.5
#: How a stream of a mixed share is finished: open-loop, open-loop but ended like a closed one
#: (by an ``append`` when no request carries a reply; the bridge), or closed-loop.
OPEN, BRIDGE, CLOSED = 0, 1, 2


def conversations(
    *,
    pool: Sequence[Image] | st.SearchStrategy[tuple[Image, ...]] | None = None,
    min_turns: int = 1,
    max_turns: int = 4,
    max_images_per_message: int = 2,
) -> st.SearchStrategy[tuple[Message, ...]]:
    """Conversations ending with a user turn: an optional shared system prompt, then user
    turns (text before, between and after images) separated by assistant replies.

    Args:
        pool: the images to use, a sequence or a strategy of tuples. Default: ``image_pools()``.
        min_turns, max_turns: number of user turns. Default: 1 and 4.
        max_images_per_message: most images in one user turn. Default: 2.

    Shrinks toward one text-only user turn without a system prompt.
    """
    int_arg("min_turns", min_turns, 1, 32)
    int_arg("max_turns", max_turns, 1, 32)
    range_arg("min_turns", min_turns, "max_turns", max_turns)
    spec = stream_spec(("",), 0, max_images_per_message)
    pools = pool_strategy(pool)

    @st.composite
    def build(draw: st.DrawFn) -> tuple[Message, ...]:
        imgs = draw(pools)
        return new_conversation(draw, imgs, spec, draw(st.integers(min_turns, max_turns)))

    return build()


def request_streams(
    *,
    min_requests: int = 2,
    max_requests: int = 8,
    namespaces: Sequence[str] = ("", "tenant-b"),
    max_new_tokens: int = 2,
    max_images_per_message: int = 2,
    pool: Sequence[Image] | st.SearchStrategy[tuple[Image, ...]] | None = None,
    moves: Sequence[str] = MOVES,
    closed_loop: bool | float = False,
    reply_tokens: tuple[int, int] = (2, 8),
    adapters: Sequence[str] = (),
) -> st.SearchStrategy[tuple[Request, ...]]:
    """Streams of requests that stress a prefix cache, run in order against one cache.

    Each request after the first is made by a move on an earlier one: an exact ``repeat``,
    an ``append``-only next turn with an assistant reply, a ``new`` conversation (often with
    a shared system prompt), an ``edit`` of an earlier user turn (a branch; images replaced by
    distinct images of the same size where possible), a ``replace`` of one image by a
    distinct one of the same size in an otherwise identical prompt, a ``swap`` of two images, a
    ``reencode`` of the images through BMP or PNG (same pixels, so the same images), or the
    same conversation in another ``namespace``, or with another ``adapter``.

    Args:
        min_requests, max_requests: stream length. Default: 2 and 8.
        namespaces: namespaces to use; the first is the default. Default: ``("", "tenant-b")``.
        max_new_tokens: largest greedy continuation per request. Default: 2.
        max_images_per_message: most images in one user turn. Default: 2.
        pool: the images (sequence or strategy of tuples). Default: ``image_pools()``.
        moves: the moves to draw from. Default: all of them.
        closed_loop: ``True``: every stream is closed-loop, ``False``: none is, a float in
            [0, 1]: that share of streams is. In a closed-loop stream an ``append`` move's
            assistant turn is the engine's own greedy reply to the request it continues (a
            :class:`~pytest_prefixcache.types.ReplyOf` marker the verifier fills in at run
            time from the cached run's :attr:`~pytest_prefixcache.types.Outcome.text`), and
            every request asks for ``reply_tokens`` new tokens. In a closed-loop stream whose
            moves sent no reply back, when ``append`` is among ``moves``, the last request is
            an ``append`` on the request before it instead. Default: ``False``.
        reply_tokens: (fewest, most) new tokens per request of a closed-loop stream.
            Default: ``(2, 8)``.
        adapters: adapter names (``Request.adapter``) requests may carry besides none; the
            ``adapter`` move is drawn only with some. Default: none.

    Shrinks toward ``min_requests`` requests, exact repeats, few short text turns, small
    solid images, the first namespace, ``max_new_tokens=0`` and open-loop streams (the
    choice is drawn first, and lowering it leaves the stream's own draws where they were,
    the ``append`` that ended a closed-loop stream included; in a closed-loop stream, toward
    the fewest ``reply_tokens``).
    """
    int_arg("min_requests", min_requests, 1, 256)
    int_arg("max_requests", max_requests, 1, 256)
    range_arg("min_requests", min_requests, "max_requests", max_requests)
    spec = stream_spec(namespaces, max_new_tokens, max_images_per_message, adapters)
    mv = usable_moves(moves, spec, MOVES)
    share = _share(closed_loop)
    lo, hi = _reply_tokens(reply_tokens)
    looped = dataclasses.replace(spec, closed_loop=True, reply_tokens=(lo, hi))
    deferred = dataclasses.replace(spec, defer_replies=True, reply_tokens=(lo, hi))
    mixed = 0.0 < share < 1.0
    loops = _loop_choice(share)
    pools = pool_strategy(pool)
    # Conversations grow turn by turn in real traffic: draw "append" twice as often.
    weighted = (*mv, "append") if "append" in mv and len(mv) > 1 else mv

    @st.composite
    def build(draw: st.DrawFn) -> tuple[Request, ...]:
        # A share of 0 or 1 draws no choice; a mixed one draws the same stream either way
        # (replies deferred) and closes it (or not) at the end, so that lowering the choice
        # leaves the stream's own draws where they were.
        loop = draw(loops) if mixed else CLOSED if share >= 1.0 else OPEN
        imgs = draw(pools)
        spec_ = looped if share >= 1.0 else deferred if mixed else spec
        stream: list[Request] = []
        while len(stream) < max_requests:
            # One "more?" draw per request (like st.lists), so shrinking deletes requests.
            if len(stream) >= min_requests and not draw(st.integers(0, CONTINUE_ODDS)):
                break
            move = draw(st.sampled_from(weighted)) if stream else "new"
            stream.append(apply_move(draw, move, stream, imgs, spec_))
        out = tuple(stream)
        if loop != OPEN and "append" in mv:  # a closed loop sends at least one reply back
            out = reply_back(draw, out, imgs, spec_, max_requests)
        return close_loop(out, loop == CLOSED, deferred) if mixed else out

    return build()


def _loop_choice(share: float) -> st.SearchStrategy[int]:
    """The choice of a mixed share, drawn first: Hypothesis fills the rest of its early
    examples (a random prefix, then the simplest choices) and their mutations with the first
    value, so a choice drawn at the end of a stream closed 34% of the streams at a share of 0.5
    (benchmarks/closed_loop_share.py). Open-loop slots first, so streams shrink toward them;
    between them and the closed-loop slots one bridge slot, so that a failure that needs the
    ``append`` a closed-loop stream was ended with shrinks to the same requests open-loop."""
    closed = min(98, max(1, round(share * 100)))
    return st.sampled_from([OPEN] * (99 - closed) + [BRIDGE] + [CLOSED] * closed)


def _share(closed_loop: object) -> float:
    if isinstance(closed_loop, bool):
        return float(closed_loop)
    if not isinstance(closed_loop, (int, float)) or not 0.0 <= closed_loop <= 1.0:
        raise InvalidArgument(
            f"closed_loop={closed_loop!r} is not a bool or a share of streams from 0 to 1"
        )
    return float(closed_loop)


def _reply_tokens(reply_tokens: object) -> tuple[int, int]:
    if (
        not isinstance(reply_tokens, tuple)
        or len(reply_tokens) != 2
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in reply_tokens)
        or not 1 <= reply_tokens[0] <= reply_tokens[1] <= 64
    ):
        raise InvalidArgument(
            f"reply_tokens={reply_tokens!r} is not a (fewest, most) pair of ints with "
            "1 <= fewest <= most <= 64"
        )
    return reply_tokens
