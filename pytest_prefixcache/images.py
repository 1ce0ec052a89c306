"""Deterministic test images: solid, gradient, noise and text-like patterns of any size.

Every image is a pure function of its spec (pattern, width, height, seed, colour), so a
request stream that names its images by spec replays bit for bit on any machine. The
``prefixcache_images`` fixture is an :class:`ImageFactory`.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import ImageError
from .types import Image

__all__ = ["MAX_SIDE", "PATTERNS", "ImageFactory", "image_from_spec", "make_image", "reencode"]

#: The patterns :func:`make_image` draws.
PATTERNS = ("solid", "gradient", "noise", "text")
#: The largest side :func:`make_image` accepts (keeps generated streams cheap).
MAX_SIDE = 4096


def _rng(pattern: str, width: int, height: int, seed: int) -> np.random.Generator:
    key = [PATTERNS.index(pattern), width, height, seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF]
    return np.random.default_rng(key)


def _colour(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 256, size=3, dtype=np.uint16)


def make_image(
    pattern: str,
    width: int,
    height: int,
    *,
    seed: int = 0,
    color: tuple[int, int, int] | None = None,
) -> Image:
    """One deterministic image.

    Args:
        pattern: one of :data:`PATTERNS`.
        width, height: size in pixels, 1 to :data:`MAX_SIDE`.
        seed: chooses the colours and the noise; the same arguments give the same pixels.
        color: for ``"solid"``, the RGB colour (default: chosen by ``seed``).
    """
    if pattern not in PATTERNS:
        raise ImageError(f"pattern {pattern!r} is not one of {', '.join(PATTERNS)}")
    for name, side in (("width", width), ("height", height)):
        if isinstance(side, bool) or not isinstance(side, int) or not 1 <= side <= MAX_SIDE:
            raise ImageError(f"{name}={side!r} is not an int from 1 to {MAX_SIDE}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ImageError(f"seed={seed!r} is not an int >= 0")
    rng = _rng(pattern, width, height, seed)
    if pattern == "solid":
        rgb = _colour(rng) if color is None else np.array(color, dtype=np.uint16)
        if rgb.shape != (3,) or rgb.min() < 0 or rgb.max() > 255:
            raise ImageError(f"color={color!r} is not three ints from 0 to 255")
        px = np.broadcast_to(rgb.astype(np.uint8), (height, width, 3))
    elif pattern == "gradient":
        a, b = _colour(rng).astype(np.float64), _colour(rng).astype(np.float64)
        angle = rng.uniform(0, 2 * np.pi)
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
        t = np.cos(angle) * xx / max(width - 1, 1) + np.sin(angle) * yy / max(height - 1, 1)
        t = (t - t.min()) / max(float(t.max() - t.min()), 1e-9)
        px = (a + (b - a) * t[..., None]).round().astype(np.uint8)
    elif pattern == "noise":
        px = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    else:  # text: dark glyph-like blocks in lines on a light page
        px = np.full((height, width, 3), 235, dtype=np.uint8)
        ink = _colour(rng) // 3
        for top in range(2, height - 3, 7):
            x = 2 + int(rng.integers(0, 3))
            while x < width - 3:
                w = int(rng.integers(1, 5))
                px[top : top + 5, x : min(x + w, width - 2)] = ink.astype(np.uint8)
                x += w + int(rng.integers(1, 4))
    return Image(np.ascontiguousarray(px, dtype=np.uint8))


def reencode(image: Image, format: str = "BMP") -> Image:
    """The same pixels after a round trip through another container (``"BMP"``, ``"PNG"``).

    The result is a new :class:`Image` object decoded by Pillow; it equals ``image`` (same
    digest), which is the point: an engine must treat it as the same image.
    """
    buf = io.BytesIO()
    image.to_pil().save(buf, format=format)
    return Image.open(buf.getvalue())


def image_from_spec(spec: Mapping[str, Any]) -> Image:
    """Build an image from a JSON spec: ``{"pattern", "width", "height", "seed"?, "color"?}``."""
    unknown = set(spec) - {"pattern", "width", "height", "seed", "color", "format"}
    if unknown:
        raise ImageError(f"image spec {dict(spec)!r} has unknown keys {sorted(unknown)}")
    try:
        pattern, width, height = spec["pattern"], spec["width"], spec["height"]
    except KeyError as exc:
        raise ImageError(f"image spec {dict(spec)!r} is missing {exc.args[0]!r}") from None
    color = spec.get("color")
    img = make_image(
        pattern,
        width,
        height,
        seed=spec.get("seed", 0),
        color=None if color is None else (int(color[0]), int(color[1]), int(color[2])),
    )
    fmt = spec.get("format")
    return reencode(img, fmt) if fmt else img


class ImageFactory:
    """A deterministic image factory (the ``prefixcache_images`` fixture).

    ``images.solid(64, 64, color=(255, 0, 0))``, ``images.gradient(32, 48, seed=1)``,
    ``images.noise(96, 16, seed=7)``, ``images.text(64, 64)``, or
    ``images("noise", 64, 64, seed=3)``; ``images.reencode(img, "BMP")`` gives the same pixels
    from another container.
    """

    patterns = PATTERNS

    def __call__(self, pattern: str, width: int, height: int, *, seed: int = 0) -> Image:
        return make_image(pattern, width, height, seed=seed)

    def solid(
        self, width: int, height: int, *, color: tuple[int, int, int] | None = None, seed: int = 0
    ) -> Image:
        return make_image("solid", width, height, seed=seed, color=color)

    def gradient(self, width: int, height: int, *, seed: int = 0) -> Image:
        return make_image("gradient", width, height, seed=seed)

    def noise(self, width: int, height: int, *, seed: int = 0) -> Image:
        return make_image("noise", width, height, seed=seed)

    def text(self, width: int, height: int, *, seed: int = 0) -> Image:
        return make_image("text", width, height, seed=seed)

    def reencode(self, image: Image, format: str = "BMP") -> Image:
        return reencode(image, format)

    def __repr__(self) -> str:
        return "<ImageFactory solid|gradient|noise|text>"
