"""Mutants of the disk tier (``persist.py``, ``disk.py``): class 25 of the bug zoo, a
persisted cache served under a stale identity or torn.

Each is the correct engine with a disk tier in a storage directory of its own (a temporary
directory unless ``cache_dir`` is given, removed at exit) and one thing broken: the identity
its keys chain from, the restored rows' dtype, or the atomicity and the check of its files.
Only a stream that restarts the engine (``--prefixcache-restarts``) can see them: without a
restart the disk is never read.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..disk import _HEAD, MAGIC, DiskTier, Rows, decode
from ..engine import Engine
from ..identity import Identity, identity_of
from ..model import LoadedModel

__all__ = ["DtypeNotRestored", "ModelDigestMissing", "TornWriteServed"]


class _OwnDirectory(Engine):
    """An engine with a disk tier in a directory of its own when none is given."""

    def __init__(self, model: LoadedModel, **kwargs: Any) -> None:
        if kwargs.get("cache_dir") is None:
            kwargs["cache_dir"] = tempfile.mkdtemp(prefix="prefixcache-mutant-kv-")
            atexit.register(shutil.rmtree, kwargs["cache_dir"], True)
        super().__init__(model, **kwargs)


class ModelDigestMissing(_OwnDirectory):
    """Class 25, stale identity: the disk keys leave the model's weights out.

    A restart with other weights of the same shapes (a new fine-tune, a re-quantization)
    restores the old model's KV: the first request after it reuses a prefix it never
    computed. Reproduces the persisted-cache keys that name the model by path or name only
    (mlx-lm #1178 and llama.cpp #25913 ask for caches that survive a restart; SGLang #39830:
    after a restart 10 of 10 requests came from disk, 0 of 10 byte-identical).
    """

    @property
    def identity(self) -> Identity:
        # BUG: the weights' digest is left out of the identity every key chains from.
        return dataclasses.replace(identity_of(self.model), model="")


class DtypeNotRestored(_OwnDirectory):
    """Class 25, stale identity: the disk keys leave the KV dtype out, and the restored rows
    keep the dtype they were stored in, not the one the engine runs.

    A restart with the KV dtype changed (float32 to float16) restores the old rows as they
    were. Reproduces SGLang #33268 (the hierarchical cache's disk keys omit the KV dtype).
    """

    @property
    def identity(self) -> Identity:
        # BUG: the KV dtype is left out of the identity...
        return dataclasses.replace(identity_of(self.model), kv_dtype="")

    def rows_from_disk(self, rows: Rows) -> Rows | None:
        # ... and the rows are restored in whatever dtype they were stored in.
        return rows


class _InPlaceDisk(DiskTier):
    """Files written in place, without a temporary file, fsync or rename, and read without
    checking their lengths or checksum (the missing bytes read as zeros)."""

    last: Path | None = None

    def write(self, target: Path, data: bytes) -> None:
        with target.open("wb") as fh:  # BUG: not atomic
            fh.write(data)
        self.last = target

    def decode(self, data: bytes) -> tuple[dict[str, Any], Rows] | None:
        if len(data) < _HEAD.size:
            return None
        magic, hlen, plen, _digest = _HEAD.unpack_from(data)
        if magic != MAGIC:
            return None
        whole = data + b"\0" * max(0, _HEAD.size + hlen + plen - len(data))
        body = whole[_HEAD.size :]
        # BUG: the checksum is recomputed over what was read, so a torn file passes.
        fixed = _HEAD.pack(magic, hlen, plen, hashlib.sha256(body).digest()) + body
        return decode(fixed)

    def tear(self) -> None:
        """What a kill during the last in-place write leaves: its first half."""
        if self.last is not None and self.last.is_file():
            data = self.last.read_bytes()
            self.last.write_bytes(data[: len(data) // 2])


class TornWriteServed(_OwnDirectory):
    """Class 25, torn write served as a hit: blocks are written in place (no temporary file,
    fsync and rename) and read back without checking their length or checksum.

    A restart that kills the engine during its last write (here: every restart; the correct
    engine's atomic rename leaves the old file or none) leaves half a file, and the next
    engine serves its missing rows as zeros. Reproduces oMLX #3539 (an SSD tier that must
    survive restarts) and SGLang #39830 (restored requests not byte-identical).
    """

    def __init__(self, model: LoadedModel, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        assert self.disk is not None
        self.disk = _InPlaceDisk(self.disk.directory, self.disk.max_bytes)

    def restart(self, changed: str | None = None) -> None:
        assert isinstance(self.disk, _InPlaceDisk)
        self.disk.tear()  # the kill: the last write's second half never reached the disk
        super().restart(changed)  # the new instance opens its own _InPlaceDisk
