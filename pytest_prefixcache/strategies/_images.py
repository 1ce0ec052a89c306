"""Strategies for images and image pools, and the pool argument every stream strategy takes."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ..images import PATTERNS, make_image
from ..types import Image
from ._args import int_arg, range_arg

__all__ = ["image_pools", "images", "pool_strategy"]


def _sides(min_side: int, max_side: int) -> None:
    int_arg("min_side", min_side, 1, 1024)
    int_arg("max_side", max_side, 1, 1024)
    range_arg("min_side", min_side, "max_side", max_side)


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
    int_arg("min_size", min_size, 1, 64)
    int_arg("max_size", max_size, 1, 64)
    range_arg("min_size", min_size, "max_size", max_size)
    _sides(min_side, max_side)
    return _pools(min_size, max_size, min_side, max_side, _patterns(patterns))


def pool_strategy(
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
