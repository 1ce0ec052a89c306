"""Image.open and Image.from_pil: every supported mode converts, every bad input is named."""

from __future__ import annotations

import io
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

from pytest_prefixcache import Image, ImageError
from pytest_prefixcache.image_io import BACKGROUND, MAX_PIXELS


def encode(img: PILImage.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def rgb(w: int = 8, h: int = 6, seed: int = 0) -> PILImage.Image:
    rng = np.random.default_rng(seed)
    return PILImage.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def test_same_pixels_in_png_and_bmp_are_the_same_image(tmp_path: Path) -> None:
    src = rgb()
    (tmp_path / "a.png").write_bytes(encode(src, "PNG"))
    (tmp_path / "a.bmp").write_bytes(encode(src, "BMP"))
    a, b = Image.open(tmp_path / "a.png"), Image.open(tmp_path / "a.bmp")
    assert a == b and a.digest == b.digest and hash(a) == hash(b)
    assert Image.open(encode(src, "PNG")) == a
    assert a.pixels.shape == (6, 8, 3) and not a.pixels.flags.writeable


def test_digest_covers_shape_not_only_bytes() -> None:
    flat = np.zeros((4, 6, 3), np.uint8)
    assert Image(flat).digest != Image(flat.reshape(6, 4, 3)).digest


def test_to_pil_round_trip() -> None:
    a = Image.from_pil(rgb())
    assert Image.from_pil(a.to_pil()) == a


@pytest.mark.parametrize(
    "data, what",
    [
        (b"", "is empty"),
        (b"definitely not an image", "not a readable image"),
        (encode(rgb(64, 64), "PNG")[:200], "not a readable image"),
        (encode(rgb(64, 64), "JPEG")[:300], "not a readable image"),
    ],
    ids=["empty", "garbage", "truncated-png", "truncated-jpeg"],
)
def test_bad_bytes_are_named(tmp_path: Path, data: bytes, what: str) -> None:
    path = tmp_path / "bad.img"
    path.write_bytes(data)
    with pytest.raises(ImageError, match=what) as info:
        Image.open(path)
    assert "bad.img" in str(info.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match=r"nope\.png.*could not be read"):
        Image.open(tmp_path / "nope.png")


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height, with one tiny IDAT: decodes lazily to a bomb."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0"))
        + chunk(b"IEND", b"")
    )


def test_hundred_megapixel_image_is_refused_before_decoding() -> None:
    with pytest.raises(ImageError, match=r"10000x10000 = 100000000 pixels, above the limit"):
        Image.open(png_header_only(10_000, 10_000))
    assert MAX_PIXELS < 100_000_000


@pytest.mark.parametrize("width, height", [(8000, 6250), (20_000, 20_000), (200_000, 1000)])
def test_every_too_large_image_gets_one_error_naming_the_file(
    tmp_path: Path, width: int, height: int
) -> None:
    """Below and above Pillow's own decompression-bomb limit (2 x PIL.Image.MAX_IMAGE_PIXELS,
    which refuses before the size is known) the error is the same: the file, its size, the
    project's limit."""
    path = tmp_path / f"big-{width}x{height}.png"
    path.write_bytes(png_header_only(width, height))
    expected = (
        rf"^image '{re.escape(str(path))}' is {width}x{height} = {width * height} pixels, "
        rf"above the limit of {MAX_PIXELS} \(pytest_prefixcache\.image_io\.MAX_PIXELS\)$"
    )
    with pytest.raises(ImageError, match=expected):
        Image.open(path)


def test_pillows_limit_is_above_ours() -> None:
    """The cases above span both sides of Pillow's bomb error (8000x6250 below it, the others
    above it) only while this holds."""
    assert 8000 * 6250 < 2 * PILImage.MAX_IMAGE_PIXELS < 20_000 * 20_000
    assert MAX_PIXELS < PILImage.MAX_IMAGE_PIXELS


def test_zero_size_images_are_refused() -> None:
    with pytest.raises(ImageError, match="zero size"):
        Image.from_pil(PILImage.new("RGB", (0, 5)))
    with pytest.raises(ImageError, match="zero size"):
        Image(np.zeros((0, 4, 3), np.uint8))


@pytest.mark.parametrize(
    "pixels, message",
    [
        (np.zeros((4, 4), np.uint8), r"shape \(H, W, 3\)"),
        (np.zeros((4, 4, 4), np.uint8), r"shape \(H, W, 3\)"),
        (np.zeros((4, 4, 3), np.float32), "must be uint8"),
        ([[0, 0, 0]], "numpy array"),
    ],
)
def test_bad_pixel_arrays(pixels, message) -> None:
    with pytest.raises(ImageError, match=message):
        Image(pixels)


def test_grayscale_palette_cmyk_convert_to_rgb() -> None:
    gray = PILImage.fromarray(np.full((3, 5), 77, np.uint8), "L")
    g = Image.open(encode(gray, "PNG"))
    assert g.pixels.shape == (3, 5, 3) and (g.pixels == 77).all()
    pal = rgb().convert("P")
    assert Image.open(encode(pal, "PNG")).pixels.shape == (6, 8, 3)
    cmyk = PILImage.new("CMYK", (4, 4), (0, 255, 255, 0))  # pure red in CMYK
    c = Image.open(encode(cmyk, "JPEG", quality=100))
    assert c.pixels.shape == (4, 4, 3) and c.pixels[..., 0].min() > 200


def test_sixteen_bit_is_scaled_by_the_top_byte() -> None:
    arr = np.full((4, 4), 0xABCD, np.uint16)
    img16 = PILImage.fromarray(arr)
    out = Image.open(encode(img16, "PNG"))
    assert (out.pixels == 0xAB).all()


def test_alpha_is_composited_on_white() -> None:
    rgba = PILImage.new("RGBA", (2, 2), (255, 0, 0, 0))  # fully transparent red
    rgba.putpixel((0, 0), (0, 0, 255, 255))  # one opaque blue pixel
    out = Image.open(encode(rgba, "PNG"))
    assert tuple(out.pixels[1, 1]) == BACKGROUND
    assert tuple(out.pixels[0, 0]) == (0, 0, 255)
    la = PILImage.new("LA", (2, 2), (0, 0))
    assert tuple(Image.open(encode(la, "PNG")).pixels[0, 0]) == BACKGROUND


def test_exif_orientation_is_applied() -> None:
    src = rgb(8, 4)  # 8 wide, 4 high
    exif = PILImage.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    rotated = Image.open(encode(src, "JPEG", exif=exif.tobytes(), quality=95))
    assert rotated.pixels.shape == (8, 4, 3)
