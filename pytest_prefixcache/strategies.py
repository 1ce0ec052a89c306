"""Hypothesis strategies for prefix-cache testing: images, image pools, conversations and
request streams.

Every strategy is keyword-only and validates its arguments when it is built, raising
``hypothesis.errors.InvalidArgument`` that repeats the bad value. Images are drawn as small
specs (pattern, size, seed) rendered deterministically, so examples are cheap to generate
and shrink well.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ._moves import (
    MOVES,
    SYSTEM_PROMPTS,
    StreamSpec,
    apply_move,
    close_loop,
    new_conversation,
    reply_back,
)
from .images import PATTERNS, make_image
from .types import Image, Message, Request
from .waves import request_waves

__all__ = [
    "CLOSED_LOOP_SHARE",
    "conversations",
    "image_pools",
    "images",
    "request_streams",
    "request_waves",
]

#: A stream goes on after each request with odds CONTINUE_ODDS : 1 (until max_requests).
CONTINUE_ODDS = 5
#: The share of streams ``--prefixcache-verify`` generates closed-loop (the engine's own
#: replies sent back as the next assistant turns; ``request_streams(closed_loop=...)``).
CLOSED_LOOP_SHARE = 0.5
#: How a stream of a mixed share is finished: open-loop, open-loop but ended like a closed one
#: (by an ``append`` when no request carries a reply; the bridge), or closed-loop.
OPEN, BRIDGE, CLOSED = 0, 1, 2


def _int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lo
        or (hi is not None and value > hi)
    ):
        bound = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
        raise InvalidArgument(f"{name}={value!r} is not an int {bound}")
    return value


def _range(lo_name: str, lo: int, hi_name: str, hi: int) -> None:
    if lo > hi:
        raise InvalidArgument(f"{lo_name}={lo!r} is larger than {hi_name}={hi!r}")


def _sides(min_side: int, max_side: int) -> None:
    _int("min_side", min_side, 1, 1024)
    _int("max_side", max_side, 1, 1024)
    _range("min_side", min_side, "max_side", max_side)


def _patterns(patterns: Sequence[str]) -> tuple[str, ...]:
    pats = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    bad = [p for p in pats if p not in PATTERNS]
    if not pats or bad:
        raise InvalidArgument(f"patterns={patterns!r} must be a non-empty subset of {PATTERNS}")
    return pats


def images(
    *, min_side: int = 16, max_side: int = 96, patterns: Sequence[str] = PATTERNS
) -> st.SearchStrategy[Image]:
    """Deterministic RGB images.

    Args:
        min_side: smallest width or height in pixels. Default: 16.
        max_side: largest width or height in pixels. Default: 96.
        patterns: which of ``"solid"``, ``"gradient"``, ``"noise"``, ``"text"`` to draw.
            Default: all four.

    Shrinks toward the first pattern (a solid colour), ``min_side`` x ``min_side``, seed 0.
    """
    _sides(min_side, max_side)
    pats = _patterns(patterns)
    side = st.integers(min_side, max_side)
    return st.builds(
        lambda p, w, h, s: make_image(p, w, h, seed=s),
        st.sampled_from(pats),
        side,
        side,
        st.integers(0, 2**16),
    )


def _side(min_side: int, max_side: int) -> st.SearchStrategy[int]:
    """Sides in range, often round ones (multiples of 16, as real images tend to be)."""
    lo, hi = -(-min_side // 16) * 16, max_side // 16 * 16
    rounds = list(range(lo, hi + 1, 16)) if lo <= hi else []
    anything = st.integers(min_side, max_side)
    return st.one_of(anything, st.sampled_from(rounds)) if rounds else anything


@st.composite
def _pools(
    draw: st.DrawFn,
    min_size: int,
    max_size: int,
    min_side: int,
    max_side: int,
    pats: tuple[str, ...],
) -> tuple[Image, ...]:
    n = draw(st.integers(min_size, max_size))
    side = _side(min_side, max_side)
    base = (draw(side), draw(side))
    first = draw(st.sampled_from(pats))
    out: list[Image] = []
    for i in range(n):
        # 0: a sibling of the first image (same pattern and size, other colours or noise),
        # 1: the same size, any pattern; 2: any size (never for the second image).
        kind = 0 if i == 0 else draw(st.integers(0, 1 if i == 1 else 2))
        w, h = (draw(side), draw(side)) if kind == 2 else base
        pattern = first if kind == 0 else draw(st.sampled_from(pats))
        seed = draw(st.integers(0, 2**16))
        img = make_image(pattern, w, h, seed=seed)
        while img in out:
            seed += 1
            img = make_image("noise", w, h, seed=seed)
        out.append(img)
    return tuple(out)


def image_pools(
    *,
    min_size: int = 2,
    max_size: int = 5,
    min_side: int = 16,
    max_side: int = 96,
    patterns: Sequence[str] = PATTERNS,
) -> st.SearchStrategy[tuple[Image, ...]]:
    """Tuples of distinct images, many of the same size (same placeholder count).

    Args:
        min_size: fewest images. Default: 2.
        max_size: most images. Default: 5.
        min_side, max_side: image side range in pixels. Default: 16 and 96.
        patterns: patterns to draw from. Default: all.

    The second image is always the same size as the first, often a sibling (the same
    pattern, other colours or noise); later ones are siblings, the same size, or any size.
    Sides are often round (multiples of 16).

    Shrinks toward ``min_size`` images that all share one small size and are solid colours.
    """
    _int("min_size", min_size, 1, 64)
    _int("max_size", max_size, 1, 64)
    _range("min_size", min_size, "max_size", max_size)
    _sides(min_side, max_side)
    return _pools(min_size, max_size, min_side, max_side, _patterns(patterns))


def _spec(
    namespaces: Sequence[str], max_new_tokens: int, max_images_per_message: int
) -> StreamSpec:
    ns = (namespaces,) if isinstance(namespaces, str) else tuple(namespaces)
    if not ns or not all(isinstance(n, str) for n in ns) or len(set(ns)) != len(ns):
        raise InvalidArgument(f"namespaces={namespaces!r} must be distinct strings, at least one")
    _int("max_new_tokens", max_new_tokens, 0, 64)
    _int("max_images_per_message", max_images_per_message, 0, 8)
    return StreamSpec(ns, max_new_tokens, max_images_per_message, SYSTEM_PROMPTS)


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
    _int("min_turns", min_turns, 1, 32)
    _int("max_turns", max_turns, 1, 32)
    _range("min_turns", min_turns, "max_turns", max_turns)
    spec = _spec(("",), 0, max_images_per_message)
    pools = _pool_strategy(pool)

    @st.composite
    def build(draw: st.DrawFn) -> tuple[Message, ...]:
        imgs = draw(pools)
        return new_conversation(draw, imgs, spec, draw(st.integers(min_turns, max_turns)))

    return build()


def _pool_strategy(
    pool: Sequence[Image] | st.SearchStrategy[tuple[Image, ...]] | None,
) -> st.SearchStrategy[tuple[Image, ...]]:
    if pool is None:
        return image_pools()
    if isinstance(pool, st.SearchStrategy):
        return pool
    imgs = tuple(pool)
    if not imgs or not all(isinstance(i, Image) for i in imgs):
        raise InvalidArgument(f"pool={pool!r} must be a non-empty sequence of Image")
    return st.just(imgs)


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
) -> st.SearchStrategy[tuple[Request, ...]]:
    """Streams of requests that stress a prefix cache, run in order against one cache.

    Each request after the first is made by a move on an earlier one: an exact ``repeat``,
    an ``append``-only next turn with an assistant reply, a ``new`` conversation (often with
    a shared system prompt), an ``edit`` of an earlier user turn (a branch; images replaced by
    distinct images of the same size where possible), a ``replace`` of one image by a
    distinct one of the same size in an otherwise identical prompt, a ``swap`` of two images, a
    ``reencode`` of the images through BMP or PNG (same pixels, so the same images), or the
    same conversation in another ``namespace``.

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

    Shrinks toward ``min_requests`` requests, exact repeats, few short text turns, small
    solid images, the first namespace, ``max_new_tokens=0`` and open-loop streams (the
    choice is drawn first, and lowering it leaves the stream's own draws where they were,
    the ``append`` that ended a closed-loop stream included; in a closed-loop stream, toward
    the fewest ``reply_tokens``).
    """
    _int("min_requests", min_requests, 1, 256)
    _int("max_requests", max_requests, 1, 256)
    _range("min_requests", min_requests, "max_requests", max_requests)
    spec = _spec(namespaces, max_new_tokens, max_images_per_message)
    mv = (moves,) if isinstance(moves, str) else tuple(moves)
    if not mv or any(m not in MOVES for m in mv):
        raise InvalidArgument(f"moves={moves!r} must be a non-empty subset of {MOVES}")
    share = _share(closed_loop)
    lo, hi = _reply_tokens(reply_tokens)
    looped = dataclasses.replace(spec, closed_loop=True, reply_tokens=(lo, hi))
    deferred = dataclasses.replace(spec, defer_replies=True, reply_tokens=(lo, hi))
    mixed = 0.0 < share < 1.0
    loops = _loop_choice(share)
    pools = _pool_strategy(pool)
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
