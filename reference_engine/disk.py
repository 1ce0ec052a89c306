"""The reference engine's disk tier: one file per stored block, under a byte budget.

A file is named by its block key's parent and digest (``<parent hex>.<digest hex>.kv``: the
siblings of a key, the blocks stored after the same chain, are one glob) and holds::

    MAGIC (8 bytes) | header length (u64) | payload length (u64) | sha256(header + payload)
    | header (JSON: the key's index, parent, tokens and image extras; each array's dtype
      and shape) | payload (the arrays' raw bytes, in header order)

It is written to a temporary file in the same directory, flushed, fsynced and renamed over
its name (then the directory is fsynced), so a reader sees the old file, the new one, or
none; never half of one. A file whose lengths or checksum do not match (a torn write, a
truncated file, a flipped bit) is never served: :meth:`DiskTier.get` counts it as ``torn``
(and a miss) and deletes it. A file whose stored key fields differ from the wanted key's is a
collision, also a miss.

The budget counts file bytes; storing past it deletes the least recently used files (reads
touch a file's mtime). Keys chain from an identity root (``identity.py``), so this tier
never needs to know the model: a file stored under another identity is simply never looked
up.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from .blocks import BlockKey

__all__ = ["DEFAULT_DISK_BYTES", "MAGIC", "DiskStats", "DiskTier", "Rows"]

MAGIC = b"PCKV\x00\x01\r\n"
_HEAD = struct.Struct("<8sQQ32s")
#: Default byte budget of a disk tier.
DEFAULT_DISK_BYTES = 256 * 1024 * 1024

Rows = list[tuple[mx.array, mx.array]]
"""Per layer, keys and values of one block's rows."""


@dataclass
class DiskStats:
    """What the disk tier did since it was opened."""

    writes: int = 0
    hits: int = 0
    misses: int = 0
    torn: int = 0
    """Files whose lengths or checksum did not match: deleted, counted as misses."""
    collisions: int = 0
    evictions: int = 0
    bytes: int = 0


def _dtype(name: str) -> Any:
    dtype = getattr(mx, name, None)
    if not isinstance(dtype, mx.Dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def encode(key: BlockKey, rows: Rows) -> bytes:
    """The file bytes of one block (see the module docstring)."""
    arrays = [a for pair in rows for a in pair]
    raw = [np.array(a.view(mx.uint8)).tobytes() for a in arrays]  # any dtype, bfloat16 too
    header = json.dumps(
        {
            "index": key.index,
            "parent": key.parent.hex(),
            "tokens": list(key.tokens),
            "extras": [list(e) for e in key.extras],
            "arrays": [[str(a.dtype).removeprefix("mlx.core."), list(a.shape)] for a in arrays],
        },
        separators=(",", ":"),
    ).encode()
    payload = b"".join(raw)
    digest = hashlib.sha256(header + payload).digest()
    return _HEAD.pack(MAGIC, len(header), len(payload), digest) + header + payload


def decode(data: bytes) -> tuple[dict[str, Any], Rows] | None:
    """The header and rows of a file's bytes, or None when it is torn (lengths or checksum)."""
    if len(data) < _HEAD.size:
        return None
    magic, hlen, plen, digest = _HEAD.unpack_from(data)
    if magic != MAGIC or len(data) != _HEAD.size + hlen + plen:
        return None
    body = data[_HEAD.size :]
    if hashlib.sha256(body).digest() != digest:
        return None
    header = json.loads(body[:hlen])
    arrays: list[mx.array] = []
    offset = hlen
    for dtype, shape in header["arrays"]:
        dt = _dtype(dtype)
        n = int(np.prod(shape)) * dt.size
        buf = np.frombuffer(body, np.uint8, n, offset)
        arrays.append(mx.array(buf).view(dt).reshape(shape))
        offset += n
    return header, [(arrays[i], arrays[i + 1]) for i in range(0, len(arrays), 2)]


def matches(header: dict[str, Any], key: BlockKey) -> bool:
    """The stored key fields are the wanted key's (else a digest collision)."""
    return (
        header.get("index") == key.index
        and header.get("parent") == key.parent.hex()
        and tuple(header.get("tokens", ())) == key.tokens
        and tuple(tuple(e) for e in header.get("extras", ())) == key.extras
    )


class DiskTier:
    """Blocks stored as files in ``directory`` (created), at most ``max_bytes`` of them.

    Args:
        directory: the storage directory; a new tier over the same directory (a restart)
            finds every file an earlier one completed.
        max_bytes: byte budget of the files. Default: ``DEFAULT_DISK_BYTES``.
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = DEFAULT_DISK_BYTES):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"disk max_bytes must be a positive int, got {max_bytes!r}")
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"disk cache directory {str(directory)!r}: {exc}") from exc
        if not self.directory.is_dir():
            raise ValueError(f"disk cache directory {str(directory)!r} is not a directory")
        self.max_bytes = max_bytes
        self.stats = DiskStats()
        self._lock = threading.Lock()
        self.stats.bytes = sum(f.stat().st_size for f in self._files())

    def _files(self) -> list[Path]:
        return [f for f in self.directory.glob("*.kv") if f.is_file()]

    def path(self, key: BlockKey) -> Path:
        return self.directory / f"{key.parent.hex()}.{key.digest.hex()}.kv"

    def siblings(self, key: BlockKey) -> list[BlockKey]:
        """The keys stored after ``key``'s parent (the blocks a partial match may use), read
        from their files' headers; torn files are counted and deleted."""
        found: list[BlockKey] = []
        for f in sorted(self.directory.glob(f"{key.parent.hex()}.*.kv")):
            try:
                decoded = self.decode(f.read_bytes())
            except OSError:
                continue
            if decoded is None:
                self.stats.torn += 1
                self._remove(f)
                continue
            h = decoded[0]
            digest = bytes.fromhex(f.name.split(".")[1])
            extras = tuple((str(d), int(o)) for d, o in h["extras"])
            found.append(BlockKey(h["index"], digest, key.parent, tuple(h["tokens"]), extras))
        return found

    def __contains__(self, key: BlockKey) -> bool:
        return self.path(key).is_file()

    def put(self, key: BlockKey, rows: Rows) -> bool:
        """Store one block atomically (temp file, fsync, rename); False when it cannot fit."""
        data = self.encode(key, rows)
        if len(data) > self.max_bytes:
            return False
        target = self.path(key)
        with self._lock:
            if target.is_file():
                return True
            self._make_room(len(data))
            self.write(target, data)
            self.stats.writes += 1
            self.stats.bytes += len(data)
        return True

    def encode(self, key: BlockKey, rows: Rows) -> bytes:
        return encode(key, rows)

    def write(self, target: Path, data: bytes) -> None:
        """Write ``data`` to ``target`` atomically: a temp file in the same directory,
        fsynced, renamed over ``target``, the directory fsynced."""
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def get(self, key: BlockKey) -> Rows | None:
        """The rows stored under ``key``, or None (missing, torn or colliding: a miss)."""
        target = self.path(key)
        try:
            data = target.read_bytes()
        except OSError:
            self.stats.misses += 1
            return None
        decoded = self.decode(data)
        if decoded is None:
            self.stats.torn += 1
            self.stats.misses += 1
            self._remove(target)
            return None
        header, rows = decoded
        if not matches(header, key):
            self.stats.collisions += 1
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        os.utime(target)  # least recently used goes first
        return rows

    def decode(self, data: bytes) -> tuple[dict[str, Any], Rows] | None:
        return decode(data)

    def clear(self) -> None:
        """Delete every block file (an engine's ``reset``)."""
        with self._lock:
            for f in self._files():
                self._remove(f)

    def _remove(self, target: Path) -> None:
        try:
            size = target.stat().st_size
            target.unlink()
        except OSError:
            return
        self.stats.bytes = max(0, self.stats.bytes - size)

    def _make_room(self, nbytes: int) -> None:
        if self.stats.bytes + nbytes <= self.max_bytes:
            return
        files = sorted(self._files(), key=lambda f: f.stat().st_mtime_ns)
        for f in files:
            if self.stats.bytes + nbytes <= self.max_bytes:
                break
            self._remove(f)
            self.stats.evictions += 1
