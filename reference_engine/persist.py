"""The engine's disk tier and restarts (``Engine(cache_dir=...)``, ``Engine.restart``).

With a storage directory, every block the engine stores in memory is also written to its disk
tier (``disk.py``), and a lookup first brings the chain's next blocks that memory lacks back
from disk, in chain order, as blocks of the pool; the lookup then runs as always. A block
restored from disk is the same rows, stored under the same key, so a hit on it follows the
rules of any hit: its logits equal a cold run's bit for bit.

Only full-attention models use the tier: a model with sliding-window or recurrent layers
resumes at snapshots (``snapshots.py``), which are not persisted, so it restores nothing.

``restart(changed)`` is the restart the plugin's restart streams ask for: the engine becomes a
new instance with the same configuration over the same directory (empty memory, the disk
kept); ``changed`` names one thing to change at the restart (:data:`RESTART_CHANGES`), which
must then reuse nothing stored before it (its keys chain from another ``Identity``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from .blocks import BlockKey
from .disk import DiskTier, Rows
from .identity import Identity, identity_of
from .kv import Segment, Window
from .model import LoadedModel, load_model

__all__ = ["RESTART_CHANGES", "Persist", "changed_model"]

#: What a restart may change: the weights (a perturbed copy of the model directory), the chat
#: template (one that renders the same text, so only the identity tells them apart), or the KV
#: dtype (the same weights cast to another dtype).
RESTART_CHANGES = ("weights", "template", "kv_dtype")


def changed_model(model: LoadedModel, changed: str) -> LoadedModel:
    """A fresh load of ``model`` with ``changed`` (one of :data:`RESTART_CHANGES`) changed and
    everything else as ``model`` runs it (its dtype, its chat template)."""
    if changed not in RESTART_CHANGES:
        raise ValueError(f"restart(changed={changed!r}): expected None or one of {RESTART_CHANGES}")
    path = model.path
    if changed == "weights":
        path = Path(tempfile.mkdtemp(prefix="prefixcache-weights-"))
        shutil.copytree(model.path, path, dirs_exist_ok=True)
        for file in sorted(path.glob("*.safetensors")):
            weights = mx.load(str(file))
            assert isinstance(weights, dict)
            for name, value in weights.items():
                if "norm" in name and mx.issubdtype(value.dtype, mx.floating):
                    weights[name] = value * 1.25  # another fine-tune of the same shapes
            mx.save_safetensors(str(file), weights, metadata={"format": "mlx"})
        atexit.register(shutil.rmtree, path, True)  # later restarts may load it again
    loaded = load_model(path)
    dtype = _dtype_of(model)
    if changed == "kv_dtype":
        dtype = mx.float16 if dtype == mx.float32 else mx.float32
    if dtype is not None and _dtype_of(loaded) != dtype:
        loaded.model.set_dtype(dtype)
    # a new template each time: a comment, so that it renders the same text
    mark = f"{{#- restarted with another template ({uuid.uuid4().hex}) -#}}"
    for new, old in zip(_template_owners(loaded), _template_owners(model)):
        template = getattr(old, "chat_template", None)
        if isinstance(template, str):
            new.chat_template = (mark if changed == "template" else "") + template
    return loaded


def _template_owners(model: LoadedModel) -> list[Any]:
    processor = model.processor
    return [processor, getattr(processor, "tokenizer", None) or processor]


def _dtype_of(model: LoadedModel) -> Any:
    for item in tree_flatten(model.model.language_model.parameters()):
        if isinstance(item[1], mx.array) and mx.issubdtype(item[1].dtype, mx.floating):
            return item[1].dtype
    return None


class Persist:
    """The disk tier and the restart of an ``Engine`` (a mixin; see the module docstring)."""

    disk: DiskTier | None
    model: LoadedModel
    _config: dict[str, Any]
    _identity: Identity | None
    disk_restored: int
    """Blocks brought back from disk since this instance started."""
    #: What ``restart(changed)`` may change (the restart streams draw from these).
    restart_changes = RESTART_CHANGES

    def open_disk(
        self, cache_dir: str | os.PathLike[str] | None, disk_bytes: int, **config: Any
    ) -> None:
        """Set up (from ``Engine.__init__``): the disk tier in ``cache_dir`` (None: none), and
        the configuration a restart builds the new instance with."""
        self._config = {**config, "cache_dir": cache_dir, "disk_bytes": disk_bytes}
        self.disk = None if cache_dir is None else DiskTier(cache_dir, disk_bytes)
        self._identity = None
        self.disk_restored = 0

    @property
    def identity(self) -> Identity:
        """What every key of this engine chains from (``identity.py``)."""
        if self._identity is None:
            self._identity = identity_of(self.model)
        return self._identity

    @property
    def persists(self) -> bool:
        """Blocks outlive a restart: a disk tier, and a model whose blocks it keeps."""
        return self.disk is not None and not self.model.stateful_layers

    def restart(self, changed: str | None = None) -> None:
        """Become a new instance with the same configuration over the same directory (the
        memory empty, the disk kept), with ``changed`` (one of :data:`RESTART_CHANGES`)
        changed; the restart streams call it between two requests, nothing in flight."""
        if changed is not None and changed not in RESTART_CHANGES:
            raise ValueError(
                f"restart(changed={changed!r}): expected None or one of {RESTART_CHANGES}"
            )
        with self._lock:  # type: ignore[attr-defined]
            origin = getattr(self, "_origin", None) or self.model
            model = self.model if changed is None else changed_model(self.model, changed)
            self._become(model)
            self._origin = None if model is origin else origin

    def _become(self, model: LoadedModel) -> None:
        """Become a new instance on ``model`` with the same configuration."""
        fresh = type(self)(model, **self._config)  # type: ignore[call-arg]
        self.__dict__.clear()
        self.__dict__.update(fresh.__dict__)

    def reset_disk(self) -> None:
        """``Engine.reset``: drop every block on disk too, and go back to the configuration
        the engine was built with (before any changed restart): the next stream starts cold
        on it."""
        if self.disk is not None:
            self.disk.clear()
        self.disk_restored = 0
        origin = getattr(self, "_origin", None)
        if origin is not None:
            self._become(origin)

    def fresh_instance(self) -> Any:
        """A fresh instance as this engine runs now (after a changed restart, the changed
        configuration), without a disk tier: the baseline audit's cold runs."""
        # the KV quantization and speculation it runs with now, however they were set
        now = {name: getattr(self, name, None) for name in ("kv_quant", "speculative")}
        return type(self)(self.model, **{**self._config, **now, "cache_dir": None})  # type: ignore[call-arg]

    # -- the disk tier ------------------------------------------------------------------------
    def store(self, cache: list[Any], keys: Sequence[BlockKey], first: int) -> None:
        super().store(cache, keys, first)  # type: ignore[misc]
        if self.persists:
            self.persist(keys[first:])

    def persist(self, keys: Sequence[BlockKey]) -> None:
        """Write the blocks of ``keys`` the pool holds to the disk tier (those not there)."""
        assert self.disk is not None
        pool = self.pool  # type: ignore[attr-defined]
        for key in keys:
            if key in self.disk:
                continue
            block = pool.acquire(key)
            if block is None:
                continue
            try:
                if isinstance(block.payload, Window):
                    self.disk.put(key, self.rows_to_disk(block.payload.layers()))
            finally:
                pool.release([block])

    def rows_to_disk(self, rows: Rows) -> Rows:
        """The rows as written (the identity: a mutant may change them)."""
        return rows

    def rows_from_disk(self, rows: Rows) -> Rows | None:
        """The rows as restored, or None (a miss) when they are not in the running KV dtype
        (the identity's ``kv_dtype`` is in every key: checked here all the same)."""
        want = self.identity.kv_dtype
        if any(str(a.dtype).removeprefix("mlx.core.") != want for pair in rows for a in pair):
            return None
        return rows

    def promote(self, keys: Sequence[BlockKey]) -> int:
        """Bring the chain's next blocks that memory lacks back from disk, in chain order, as
        blocks of the pool (one segment each); return how many."""
        assert self.disk is not None
        pool = self.pool  # type: ignore[attr-defined]
        restored = 0
        with self._compute:  # type: ignore[attr-defined]
            for key in keys:
                if key.digest in pool:
                    continue
                if key in self.disk:
                    if not self.bring_back(key):
                        break
                    restored += 1
                    continue
                # the chain ends here on disk: its siblings, for a partial match (pool.reuse)
                restored += sum(
                    self.bring_back(k) for k in self.disk.siblings(key) if k.digest not in pool
                )
                break
        self.disk_restored += restored
        return restored

    def bring_back(self, key: BlockKey) -> bool:
        """Load one block from disk into the pool (one segment); False when it is not there
        (missing, torn, another dtype) or does not fit."""
        assert self.disk is not None
        pool, kv = self.pool, self.kv  # type: ignore[attr-defined]
        rows = self.disk.get(key)
        rows = None if rows is None else self.rows_from_disk(rows)
        if rows is None:
            return False
        n = len(key.tokens)
        window = Segment(rows, n).window(0, n)
        kv.segments.track([window])
        block = pool.insert(key, window, window.nbytes)
        if block is None:
            kv.segments.discard([window])
            return False
        pool.release([block])
        return True
