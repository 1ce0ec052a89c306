"""Decoding image files and Pillow images into RGB pixel arrays, with clear errors.

Rules (documented in the README):
- Every image becomes 8-bit RGB, shape (H, W, 3).
- EXIF orientation is applied, so a rotated JPEG gives the pixels a viewer shows.
- Transparency (RGBA, LA, palette with transparency) is composited on white (255, 255, 255).
- Grayscale, palette, CMYK, YCbCr and 16-bit images are converted; 16-bit samples are scaled
  to 8 bits by their top byte.
- Images larger than ``MAX_PIXELS`` are refused before their pixels are decoded.
"""

from __future__ import annotations

import io
import os
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ImageError

if TYPE_CHECKING:
    from PIL import Image as PILImage

__all__ = ["BACKGROUND", "MAX_PIXELS", "decode_source", "pil_to_rgb"]

#: The most pixels (width * height) an image may have: 40 megapixels.
MAX_PIXELS = 40_000_000
#: The colour transparent pixels are composited on.
BACKGROUND = (255, 255, 255)


def _describe(source: Any) -> str:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes>"
    return repr(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else repr(source)


def _check_size(width: int, height: int, name: str) -> None:
    if width <= 0 or height <= 0:
        raise ImageError(f"image {name} has zero size ({width}x{height})")
    if width * height > MAX_PIXELS:
        raise ImageError(_too_large(name, f"{width}x{height} = {width * height}"))


def _too_large(name: str, pixels: str) -> str:
    return (
        f"image {name} is {pixels} pixels, above the limit of {MAX_PIXELS} "
        "(pytest_prefixcache.image_io.MAX_PIXELS)"
    )


def _header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from an image header, by Pillow's format plugins but without the
    decompression-bomb check ``PIL.Image.open`` adds; None when no plugin reads it."""
    from PIL import Image as PILImage

    PILImage.init()
    for fmt in PILImage.ID:
        factory, accept = PILImage.OPEN[fmt]
        if accept is not None and not accept(data[:16]):
            continue
        try:
            with factory(io.BytesIO(data), "") as img:
                return img.size
        except Exception:
            continue
    return None


def pil_to_rgb(img: PILImage.Image, name: str = "<PIL image>") -> np.ndarray:
    """Convert a Pillow image to a read-only uint8 (H, W, 3) RGB array by the rules above."""
    from PIL import Image as PILImage
    from PIL import ImageOps

    _check_size(img.width, img.height, name)
    try:
        img = ImageOps.exif_transpose(img)
        if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
            arr: np.ndarray = np.asarray(img, dtype=np.uint32)
            if img.mode == "I" and arr.max(initial=0) > 0xFFFF:
                arr = arr >> 16
            img = PILImage.fromarray((arr >> 8).astype(np.uint8), mode="L")
        if img.mode == "P" and "transparency" in img.info:
            img = img.convert("RGBA")
        if img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
            rgba = img.convert("RGBA")
            base = PILImage.new("RGBA", rgba.size, (*BACKGROUND, 255))
            img = PILImage.alpha_composite(base, rgba)
        rgb = img.convert("RGB")
        arr = np.array(rgb, dtype=np.uint8)
    except ImageError:
        raise
    except Exception as exc:
        raise ImageError(f"image {name} could not be decoded: {type(exc).__name__}: {exc}") from exc
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ImageError(f"image {name} decoded to shape {arr.shape}, expected (H, W, 3)")
    arr.setflags(write=False)
    return arr


def decode_source(source: str | os.PathLike[str] | bytes | bytearray | memoryview) -> np.ndarray:
    """Decode a file path or encoded bytes into RGB pixels; raise ImageError naming the source."""
    from PIL import Image as PILImage

    name = _describe(source)
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
        else:
            with open(os.fspath(source), "rb") as fh:
                data = fh.read()
    except OSError as exc:
        raise ImageError(f"image {name} could not be read: {exc.strerror or exc}") from exc
    if not data:
        raise ImageError(f"image {name} is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            # our own MAX_PIXELS check below is stricter than Pillow's bomb warning
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
            img = PILImage.open(io.BytesIO(data))
        with img:
            _check_size(img.width, img.height, name)
            img.load()
            return pil_to_rgb(img, name)
    except ImageError:
        raise
    except PILImage.DecompressionBombError as exc:
        # Pillow refuses before we see the size (above 2 x its MAX_IMAGE_PIXELS): read the
        # size from the header, so every too-large image gets the same error.
        size = _header_size(data)
        what = f"{size[0]}x{size[1]} = {size[0] * size[1]}" if size else f"(Pillow: {exc})"
        raise ImageError(_too_large(name, what)) from None
    except Exception as exc:
        raise ImageError(
            f"image {name} is not a readable image (truncated or corrupt?): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
