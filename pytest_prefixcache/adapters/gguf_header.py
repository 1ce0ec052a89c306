"""The model family of a GGUF file, from its header (stdlib only): the key
``general.architecture`` (``llama``, ``gemma3``, ``qwen2vl``...), which llama-server's
tolerance rules are measured per (:mod:`.llama`).

GGUF (v2 and v3): the magic ``GGUF``, a little-endian u32 version, u64 tensor and key-value
counts, then the key-value pairs: a key (u64 length, UTF-8 bytes), a u32 value type and the
value. ``general.architecture`` is a string (type 8) and comes first in every file llama.cpp's
converters write; the reader walks the pairs until it finds it, skipping other values by type.
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO

from ..errors import EngineError

__all__ = ["gguf_architecture"]

#: Fixed-size value types and their sizes (gguf.GGUFValueType).
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def _u(f: BinaryIO, fmt: str) -> int:
    raw = f.read(struct.calcsize(fmt))
    if len(raw) != struct.calcsize(fmt):
        raise EOFError
    return int(struct.unpack(fmt, raw)[0])


def _string(f: BinaryIO) -> str:
    n = _u(f, "<Q")
    raw = f.read(n)
    if len(raw) != n:
        raise EOFError
    return raw.decode("utf-8", errors="replace")


def _skip(f: BinaryIO, kind: int) -> None:
    if kind == _STRING:
        _string(f)
    elif kind == _ARRAY:
        item, n = _u(f, "<I"), _u(f, "<Q")
        if item in _SIZES:
            f.seek(_SIZES[item] * n, os.SEEK_CUR)
        else:
            for _ in range(n):
                _skip(f, item)
    elif kind in _SIZES:
        f.seek(_SIZES[kind], os.SEEK_CUR)
    else:
        raise ValueError(f"unknown value type {kind}")


def gguf_architecture(path: str | os.PathLike[str]) -> str:
    """The ``general.architecture`` of the GGUF at ``path``; EngineError naming the file when
    it is missing, not a GGUF, or has no such key."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise EngineError(f"{os.fspath(path)}: not a GGUF file (no GGUF magic)")
            version = _u(f, "<I")
            if version < 2:
                raise EngineError(f"{os.fspath(path)}: GGUF version {version} (2 or 3 expected)")
            _u(f, "<Q")  # tensors
            for _ in range(_u(f, "<Q")):
                key, kind = _string(f), _u(f, "<I")
                if key == "general.architecture" and kind == _STRING:
                    return _string(f)
                _skip(f, kind)
    except OSError as exc:
        raise EngineError(f"{os.fspath(path)}: cannot read the GGUF header ({exc})") from None
    except (EOFError, ValueError) as exc:
        raise EngineError(
            f"{os.fspath(path)}: a truncated or corrupt GGUF header ({exc})"
        ) from None
    raise EngineError(f"{os.fspath(path)}: no general.architecture key in the GGUF header")
