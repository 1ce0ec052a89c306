"""Request streams as JSON files: failing streams saved for replay, and the scenario corpus.

A stream file looks like::

    {"format": "pytest-prefixcache/stream/v1",
     "description": "...",
     "images": {"red": {"pattern": "solid", "width": 64, "height": 64, "color": [255, 0, 0]}},
     "requests": [{"namespace": "", "max_new_tokens": 0,
                   "messages": [{"role": "user", "content": ["Describe", {"image": "red"}]}]}]}

An image part names an entry of ``images`` (a generator spec, see
:func:`pytest_prefixcache.images.image_from_spec`), or a PNG/BMP/JPEG file relative to the
JSON file, or gives a spec inline. A stream of concurrent waves (the waves property) adds
``"waves": [{"requests": [0, 1, 2], "arrival_ms": [0, 5, 5]}, ...]``: the indexes of
``requests`` each wave sends together, in order, and each one's arrival offset in
milliseconds (:func:`waves_from` builds them; a file without the key is a sequential stream,
as before). Failing streams are written as ``stream.json`` plus one PNG
per distinct image under ``.prefixcache/failures/<id>/``; ``<id>`` is a hash of the stream.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import PrefixCacheError
from ..images import image_from_spec
from ..package_data import CORPUS
from ..types import MAX_ARRIVAL, Image, Message, Request, Wave

__all__ = [
    "FORMAT",
    "corpus_dirs",
    "corpus_files",
    "load_stream",
    "save_stream",
    "stream_id",
    "stream_to_json",
    "waves_from",
    "waves_to_json",
]

FORMAT = "pytest-prefixcache/stream/v1"
STREAM_FILE = "stream.json"
#: Where failing streams are saved, relative to the invocation directory, unless told.
FAILURES_DIR = Path(".prefixcache") / "failures"


def _image_name(img: Image) -> str:
    return f"img-{img.digest[:16]}.png"


def stream_to_json(stream: Sequence[Request], description: str = "") -> dict[str, Any]:
    """The JSON form of a stream; images are named by file (see :func:`save_stream`)."""
    requests = []
    for req in stream:
        messages = []
        for m in req.messages:
            content: list[Any] = [
                p if isinstance(p, str) else {"image": _image_name(p)} for p in m.content
            ]
            messages.append({"role": m.role, "content": content})
        saved: dict[str, Any] = {"namespace": req.namespace, "max_new_tokens": req.max_new_tokens}
        if req.adapter is not None:  # files without adapters stay as they were
            saved["adapter"] = req.adapter
        requests.append({**saved, "messages": messages})
    return {"format": FORMAT, "description": description, "requests": requests}


def waves_to_json(waves: Sequence[Wave]) -> list[dict[str, Any]]:
    """The ``"waves"`` entry of a stream file whose ``requests`` are the waves' requests in
    order."""
    out, first = [], 0
    for wave in waves:
        out.append(
            {
                "requests": list(range(first, first + len(wave))),
                "arrival_ms": [round(a * 1000, 3) for a in wave.arrivals],
            }
        )
        first += len(wave)
    return out


def waves_from(stream: Sequence[Request], meta: dict[str, Any]) -> tuple[Wave, ...] | None:
    """The waves a loaded stream file declares under ``"waves"`` (None when it declares none),
    checked: every request index in range, used at most once, arrivals in milliseconds from 0
    to 10,000. Raises PrefixCacheError naming the field (``waves[1].arrival_ms[0]``)."""
    raw = meta.get("waves")
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise PrefixCacheError(f"waves: is {raw!r:.60}, expected a non-empty JSON array")
    seen: set[int] = set()
    waves = []
    for w, entry in enumerate(raw):
        at = f"waves[{w}]"
        try:
            idx = _field(entry, "requests", at, list)
            ms = _field(entry, "arrival_ms", at, list, [0] * len(idx))
        except _Malformed as exc:
            raise PrefixCacheError(str(exc)) from None
        if not idx:
            raise PrefixCacheError(f"{at}.requests: is empty; a wave sends at least one request")
        if len(ms) != len(idx):
            raise PrefixCacheError(
                f"{at}.arrival_ms: has {len(ms)} offsets for {len(idx)} requests"
            )
        for k, i in enumerate(idx):
            ok = isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(stream)
            if not ok or i in seen:
                why = "used twice" if ok else f"not a request index from 0 to {len(stream) - 1}"
                raise PrefixCacheError(f"{at}.requests[{k}]: {i!r} is {why}")
            seen.add(i)
        for k, a in enumerate(ms):
            ok = isinstance(a, (int, float)) and not isinstance(a, bool)
            if not ok or not 0 <= a <= MAX_ARRIVAL * 1000:
                raise PrefixCacheError(
                    f"{at}.arrival_ms[{k}]: {a!r} is not milliseconds from 0 to "
                    f"{MAX_ARRIVAL * 1000:g}"
                )
        waves.append(Wave(tuple(stream[i] for i in idx), tuple(a / 1000 for a in ms)))
    return tuple(waves)


def stream_id(stream: Sequence[Request]) -> str:
    """A short stable id of a stream's content (the image parts by digest)."""
    blob = json.dumps(stream_to_json(stream), sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def save_stream(stream: Sequence[Request], directory: str | os.PathLike[str], **meta: Any) -> Path:
    """Write ``stream.json`` and one PNG per distinct image into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for req in stream:
        for img in req.images:
            path = out / _image_name(img)
            if not path.exists():
                img.to_pil().save(path, format="PNG")
    data = stream_to_json(stream, meta.pop("description", ""))
    data.update(meta)
    path = out / STREAM_FILE
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path


class _Malformed(Exception):
    """A field of a stream file is wrong: ``path`` names it (``requests[2].messages[0].role``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")


_MISSING = object()


def _field(
    obj: Any, key: str, at: str, kind: type | tuple[type, ...], default: Any = _MISSING
) -> Any:
    """``obj[key]`` checked to be a ``kind``; ``at`` is the path of ``obj`` in the file."""
    where = f"{at}.{key}" if at else key
    if not isinstance(obj, dict):
        raise _Malformed(at or "the file", f"is {obj!r:.60}, expected a JSON object")
    if key not in obj:
        if default is not _MISSING:
            return default
        raise _Malformed(where, "is missing")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise _Malformed(where, f"is {value!r:.60}, expected {_JSON_NAMES.get(names, names)}")
    return value


_JSON_NAMES = {"list": "a JSON array", "dict": "a JSON object", "str": "a string",
               "int": "an integer"}  # fmt: skip


def _image(part: Any, named: dict[str, Any], base: Path) -> Image:
    if isinstance(part, dict):
        return image_from_spec(part)
    if not isinstance(part, str):
        raise PrefixCacheError(f"an image must be a name, a file or a spec, got {part!r}")
    if part in named:
        return named[part] if isinstance(named[part], Image) else image_from_spec(named[part])
    return Image.open(base / part)


def _requests(data: dict[str, Any], base: Path) -> list[Request]:
    named: dict[str, Any] = dict(_field(data, "images", "", (dict, type(None)), None) or {})
    cache: dict[str, Image] = {}
    requests = []
    for i, r in enumerate(_field(data, "requests", "", list)):
        at = f"requests[{i}]"
        messages = []
        for j, m in enumerate(_field(r, "messages", at, list)):
            mat = f"{at}.messages[{j}]"
            role = _field(m, "role", mat, str)
            parts: list[str | Image] = []
            for k, part in enumerate(_field(m, "content", mat, list)):
                if isinstance(part, str):
                    parts.append(part)
                    continue
                ref = _field(part, "image", f"{mat}.content[{k}]", (str, dict))
                key = json.dumps(ref, sort_keys=True)
                if key not in cache:
                    try:
                        cache[key] = _image(ref, named, base)
                    except PrefixCacheError as exc:
                        raise _Malformed(f"{mat}.content[{k}].image", str(exc)) from exc
                parts.append(cache[key])
            try:
                messages.append(Message(role, tuple(parts)))
            except PrefixCacheError as exc:
                raise _Malformed(f"{mat}.role", str(exc)) from exc
        namespace = _field(r, "namespace", at, str, "")
        max_new = _field(r, "max_new_tokens", at, int, 0)
        adapter = _field(r, "adapter", at, (str, type(None)), None)
        try:
            requests.append(Request(tuple(messages), namespace, max_new, adapter))
        except PrefixCacheError as exc:
            raise _Malformed(at, str(exc)) from exc
    return requests


def load_stream(path: str | os.PathLike[str]) -> tuple[tuple[Request, ...], dict[str, Any]]:
    """Read a stream file (or a failure directory holding ``stream.json``); an error names the
    file and the field (``requests[2].messages[0].role``) that is wrong."""
    p = Path(path)
    if p.is_dir():
        p = p / STREAM_FILE
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PrefixCacheError(f"cannot read stream file {str(p)!r}: {exc.strerror}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PrefixCacheError(f"stream file {str(p)!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PrefixCacheError(f"stream file {str(p)!r} does not declare format {FORMAT!r}")
    try:
        requests = _requests(data, p.parent)
    except _Malformed as exc:
        raise PrefixCacheError(f"stream file {str(p)!r}: {exc}") from exc
    if not requests:
        raise PrefixCacheError(f"stream file {str(p)!r} has no requests")
    meta = {k: v for k, v in data.items() if k not in ("requests", "images", "format")}
    return tuple(requests), meta


def corpus_dirs(rootdir: str | os.PathLike[str] | None = None) -> list[Path]:
    """The corpus directories: the built-in one (shipped with the package) and the project's
    ``<rootdir>/fixtures/corpus`` when there is one. Raise PrefixCacheError when the built-in
    corpus is missing: a broken install would otherwise verify without it, silently."""
    if not CORPUS.is_dir():
        raise PrefixCacheError(
            f"the built-in scenario corpus is missing: {str(CORPUS)!r} is not a directory "
            "(reinstall pytest-prefixcache; a wheel carries it as pytest_prefixcache/fixtures)"
        )
    dirs = [CORPUS]
    project = Path(rootdir) / "fixtures" / "corpus" if rootdir else None
    if project is not None and project.is_dir() and project.resolve() != CORPUS.resolve():
        dirs.append(project)
    return dirs


def corpus_files(rootdir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Every ``*.json`` scenario of the corpus, sorted by name within each directory."""
    return [f for d in corpus_dirs(rootdir) for f in sorted(d.glob("*.json"))]
