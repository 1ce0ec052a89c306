"""A failing stream, read from its saved directory (``stream.json`` and one PNG per image),
rendered as a conversation: one block per request, messages with roles, text and images
inline as data URIs, the failing request open and highlighted.

Only the standard library is used to read the stream: image files are embedded as they are
(never decoded), and only files inside the stream's directory are read. Images given as a
generator spec (corpus files, not saved failures) are drawn with :mod:`pytest_prefixcache.images`,
imported on first use.
"""

from __future__ import annotations

import base64
import json
import os
import struct
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

__all__ = ["STREAM_FILE", "find_stream_dir", "render_stream"]

STREAM_FILE = "stream.json"
#: Images are shown this many CSS pixels on their longer side (small ones at an integer scale).
DISPLAY = 160
#: Image files larger than this are not embedded.
MAX_IMAGE_BYTES = 8 * 1024 * 1024
_MIME = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg", b"BM": "image/bmp",
         b"GIF8": "image/gif"}  # fmt: skip


def find_stream_dir(
    stream_dir: str | None, base_dir: str | os.PathLike[str] | None = None
) -> Path | None:
    """The directory of a failure's saved stream, or None when it is not there.

    A relative ``stream_dir`` is taken relative to ``base_dir`` (the report's directory). When
    the report was moved with its failures (a CI artifact), a path that is not there is looked
    for as ``base_dir/failures/<its last part>`` (the layout of ``prefixcache verify --out``)
    and ``base_dir/.prefixcache/failures/<its last part>`` (pytest's default).
    """
    if not stream_dir:
        return None
    p = Path(stream_dir)
    candidates = [p] if p.is_absolute() or base_dir is None else [Path(base_dir) / p]
    if base_dir is not None:
        base = Path(base_dir)
        candidates += [base / "failures" / p.name, base / ".prefixcache" / "failures" / p.name]
    for c in candidates:
        if (c / STREAM_FILE).is_file():
            return c
    return None


def _png_size(data: bytes) -> tuple[int, int] | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    return None


class _Images:
    """Data URIs of a stream's images, each file read once."""

    def __init__(self, directory: Path, named: dict[str, Any]) -> None:
        self.directory = directory.resolve()
        self.named = named
        self.cache: dict[str, tuple[str, tuple[int, int] | None] | str] = {}

    def get(self, ref: Any) -> tuple[str, tuple[int, int] | None] | str:
        """``(data URI, (width, height) or None)``, or why the image cannot be shown."""
        key = json.dumps(ref, sort_keys=True)
        if key not in self.cache:
            self.cache[key] = self._load(ref)
        return self.cache[key]

    def html(self, ref: Any) -> str:
        """The image with a caption (its digest and size), or a note saying why not."""
        got = self.get(ref)
        if isinstance(got, str):
            return f'<div class="note missing-image">{escape(got)}</div>'
        uri, size = got
        name = ref if isinstance(ref, str) else "image spec"
        short = name.removeprefix("img-").rsplit(".", 1)[0][:12]
        dims = caption = ""
        if size:
            w, h = size
            scale = max(1, DISPLAY // max(w, h, 1)) if max(w, h) < DISPLAY else DISPLAY / max(w, h)
            dims = f' width="{w}" height="{h}" style="width:{round(w * scale)}px"'
            caption = f" &middot; {w}&times;{h}"
        return (
            f'<figure class="image" title="{escape(name)}"><img class="failure-image" '
            f'src="{uri}"{dims} alt="{escape(name)}"><figcaption>{escape(short)}{caption}'
            "</figcaption></figure>"
        )

    def thumb(self, ref: Any) -> str:
        """A small copy for a request's one-line summary (nothing when it cannot be shown)."""
        got = self.get(ref)
        if isinstance(got, str):
            return '<span class="thumb missing" title="missing image">?</span>'
        return f'<img class="thumb" src="{got[0]}" alt="">'

    def _load(self, ref: Any) -> tuple[str, tuple[int, int] | None] | str:
        spec = self.named.get(ref) if isinstance(ref, str) else ref
        if isinstance(spec, dict):
            return self._draw(spec)
        if not isinstance(ref, str):
            return f"image {ref!r:.80} is neither a file name nor a spec"
        path = (self.directory / ref).resolve()
        if not path.is_relative_to(self.directory):
            return f"image {ref!r} is outside the stream's directory; not embedded"
        try:
            if path.stat().st_size > MAX_IMAGE_BYTES:
                return f"image {ref!r} is larger than {MAX_IMAGE_BYTES} bytes; not embedded"
            data = path.read_bytes()
        except OSError as exc:
            return f"image {ref!r} is missing from {self.directory} ({exc.strerror or exc})"
        mime = next((m for sig, m in _MIME.items() if data.startswith(sig)), None)
        if mime is None:
            return f"image {ref!r} is not a PNG, JPEG, BMP or GIF file; not embedded"
        return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}", _png_size(data)

    def _draw(self, spec: dict[str, Any]) -> tuple[str, tuple[int, int] | None] | str:
        import io

        try:
            from ..images import image_from_spec

            pil = image_from_spec(spec).to_pil()
            buf = io.BytesIO()
            pil.save(buf, format="PNG")
        except Exception as exc:  # any failure to draw is shown, never raised
            return f"image spec {spec!r:.120} could not be drawn: {exc}"
        data = buf.getvalue()
        return f"data:image/png;base64,{base64.b64encode(data).decode('ascii')}", _png_size(data)


def _message(m: Any, images: _Images) -> str:
    if not isinstance(m, dict):
        return f'<div class="note">malformed message {m!r:.80}</div>'
    role = str(m.get("role", "?"))
    parts = []
    for part in m.get("content", []) if isinstance(m.get("content"), list) else []:
        if isinstance(part, str):
            parts.append(f'<div class="text">{escape(part)}</div>')
        elif isinstance(part, dict) and "image" in part:
            parts.append(images.html(part["image"]))
        else:
            parts.append(f'<div class="note">unknown part {part!r:.80}</div>')
    role_cls = role if role in ("system", "user", "assistant", "tool") else "other"
    return (
        f'<div class="msg role-{role_cls}"><div class="role">{escape(role)}</div>'
        f'<div class="content">{"".join(parts) or "<em>(empty)</em>"}</div></div>'
    )


def _request(i: int, r: Any, failing: int | None, images: _Images) -> str:
    messages: Sequence[Any] = r.get("messages", []) if isinstance(r, dict) else []
    refs = [
        p["image"]
        for m in messages
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, dict) and "image" in p
    ]
    bits = [f"{len(messages)} message(s)", f"{len(refs)} image(s)"]
    if isinstance(r, dict):
        if r.get("namespace"):
            bits.append(f"namespace {r['namespace']!r}")
        if r.get("adapter"):
            bits.append(f"adapter {r['adapter']!r}")
        if r.get("max_new_tokens"):
            bits.append(f"{r['max_new_tokens']} new token(s)")
    is_failing = i == failing
    flag = '<span class="badge fail">failing request</span> ' if is_failing else ""
    cls = "request failing" if is_failing else "request"
    body = "".join(_message(m, images) for m in messages)
    return (
        f'<details class="{cls}" data-request="{i}"{" open" if is_failing else ""}>'
        f"<summary>{flag}<strong>request {i}</strong> "
        f'<span class="muted">{escape(" · ".join(bits))}</span> '
        f'<span class="thumbs">{"".join(images.thumb(ref) for ref in refs)}</span></summary>'
        f'<div class="messages">{body}</div></details>'
    )


def render_stream(directory: Path, failing: int | None) -> str:
    """The stream saved in ``directory`` as HTML; a malformed file becomes a note."""
    path = directory / STREAM_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        requests = data["requests"]
        if not isinstance(requests, list):
            raise TypeError("'requests' is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = escape(f"cannot read {path}: {exc}")
        return f'<p class="note missing-stream">The saved stream is unreadable: {why}</p>'
    named = data.get("images") if isinstance(data.get("images"), dict) else {}
    images = _Images(directory, named)
    head = ""
    if data.get("description"):
        head = f'<p class="muted">{escape(str(data["description"]))}</p>'
    if failing is not None and not 0 <= failing < len(requests):
        head += f'<p class="note">The failing request index {failing} is not in this stream.</p>'
    blocks = "".join(_request(i, r, failing, images) for i, r in enumerate(requests))
    return f'{head}<div class="stream">{blocks}</div>'
