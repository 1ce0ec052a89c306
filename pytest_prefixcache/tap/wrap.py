"""Installing the tap: wrap ``__call__`` of the language-model classes to record each call."""

from __future__ import annotations

import base64
import importlib
import inspect
import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from . import ENV, identity, identity_omlx, identity_vlm
from ._labels import take_padding

__all__ = ["DEFAULT_TARGETS", "install", "install_identity"]

#: ``module:Class`` of the language models wrapped by default (skipped when not importable):
#: for each family the innermost class whose call returns the logits (mlx-lm's ``qwen3_5.Model``
#: and ``gemma3.Model`` only hand their input to these). Subclasses (``qwen3_5_moe``) inherit the
#: wrapped call. ``$PREFIXCACHE_TAP_TARGETS`` replaces the list.
DEFAULT_TARGETS = (
    "mlx_lm.models.llama:Model",
    "mlx_lm.models.qwen2:Model",
    "mlx_lm.models.qwen3:Model",
    "mlx_lm.models.qwen3_5:TextModel",
    "mlx_lm.models.qwen3_next:Model",
    "mlx_lm.models.gemma3_text:Model",
    "mlx_lm.models.gemma4_text:Model",
    "mlx_vlm.models.qwen2_vl.language:LanguageModel",
    "mlx_vlm.models.qwen2_5_vl.language:LanguageModel",
    "mlx_vlm.models.qwen3_5.language:LanguageModel",
    "mlx_vlm.models.qwen3_5_moe.language:LanguageModel",
    "mlx_vlm.models.gemma3.language:LanguageModel",
    "mlx_vlm.models.gemma4.language:LanguageModel",
)

#: Per thread: how many tapped calls are running. Only the outermost is recorded, so a target
#: list naming both a wrapper and the class it calls still gives one record per forward call.
_depth = threading.local()


class _Sink:
    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.seq = 0

    def header(self, wrapped: Sequence[str]) -> None:
        """The first line a process writes: which classes it wrapped (the reader names them
        when no call was recorded)."""
        with self.lock, open(self.path, "a") as f:
            f.write(json.dumps({"installed": list(wrapped), "pid": os.getpid()}) + "\n")

    def admit(self, label: str, reply_id: str, scheduler: str) -> None:
        """An admission line: the scheduler's id ``label`` (its rows' ``id``) answers the HTTP
        exchange whose reply carries ``reply_id``."""
        line = {"admit": label, "reply": reply_id, "by": scheduler, "pid": os.getpid()}
        with self.lock, open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def write(
        self, cls: str, n: int, batch: int, offset: int, rows: list[dict[str, Any]], key: str
    ) -> None:
        with self.lock:
            rec = {
                "seq": self.seq,
                "cls": cls,
                "n": n,
                "batch": batch,
                "offset": offset,
                "pid": os.getpid(),
                "cache": key,
                "rows": rows,
            }
            self.seq += 1
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")


def _layer(cache: Any) -> Any:
    """The first layer cache with a KV offset: on a hybrid, layer 0 holds a recurrent state
    (``ArraysCache``, no offset); a rotating window's ``offset`` counts every position seen,
    not the ring's size. None when no layer has one."""
    for layer in cache or ():
        if getattr(layer, "offset", None) is not None:
            return layer
    return None


def _per_row(value: Any, batch: int) -> list[int] | None:
    """An int, or a batch cache's array with one entry per row, as one int per row."""
    if value is None:
        return None
    if isinstance(value, int):
        return [value] * batch
    import numpy as np

    rows = [int(v) for v in np.asarray(value).reshape(-1)]
    if len(rows) == 1:
        return rows * batch
    return rows if len(rows) == batch else None


def _offset(cache: Any, n: int) -> int:
    """The KV offset after a call with ``n`` positions (a batch cache's: its longest row's):
    ``n`` without a cache, -1 when no layer has an offset."""
    if not cache:
        return n
    layer = _layer(cache)
    if layer is None:
        return -1
    if isinstance(layer.offset, int):
        return layer.offset
    import numpy as np

    return int(np.asarray(layer.offset).max())


def _pads(layer: Any, batch: int) -> list[int] | None:
    """The right padding of each row of a batch cache's layer: a ``BatchKVCache`` keeps it
    (``_right_padding``); a ``BatchRotatingKVCache`` (a sliding-window layer, the first offset
    layer of Gemma 3) keeps each row's real end instead (``_lengths``: padding is what its
    offset counts past it). None when the layer says neither."""
    if layer is None:
        return None
    right = getattr(layer, "_right_padding", None)
    if right is not None:
        return _per_row(right, batch)
    ends = getattr(layer, "_lengths", None)
    if ends is None or isinstance(layer.offset, int):
        return None
    import numpy as np

    return _per_row(np.maximum(0, np.asarray(layer.offset) - np.asarray(ends)), batch)


def _rolls_padding(layer: Any) -> bool:
    """Whether ``layer`` drops a right-padded row's padding from its offset before it appends a
    prefill chunk: a batch rotating cache keeping each row's real end (``_lengths``: mlx-lm's
    and mlx-vlm's ``BatchRotatingKVCache._update_concat`` roll ``offset - _lengths`` into the
    left padding first), so its offset before a call never holds padding of earlier chunks; a
    ``BatchKVCache`` (``_right_padding``) keeps that padding until ``finalize``. By the class's
    name (its subclasses too): another cache's ``_lengths`` means something else (mlx-vlm's
    ``BatchPoolingCache`` sets it from the start)."""
    rotating = any(c.__name__ == "BatchRotatingKVCache" for c in type(layer).__mro__)
    return rotating and getattr(layer, "_lengths", None) is not None


def _offsets(cache: Any) -> Any:
    """The first offset layer's offset now (an int or a batch cache's array), or None."""
    layer = _layer(cache)
    return None if layer is None else layer.offset


#: Serials of the cache objects the tap has seen (a copy, a new object, gets a new one).
_counter = iter(range(1, 1 << 62))
_counter_lock = threading.Lock()


def _cache_key(cache: Any) -> str:
    """A name for the batch a call ran on: the first offset layer's object, numbered the first
    time the tap sees it (a copy of it, made by ``copy.deepcopy``, is numbered anew)."""
    layer = _layer(cache)
    if layer is None:
        return f"{os.getpid()}:-"
    mark = getattr(layer, "_prefixcache_tap", None)
    if not (isinstance(mark, tuple) and len(mark) == 2 and mark[1] == id(layer)):
        with _counter_lock:
            mark = (next(_counter), id(layer))
        try:
            layer._prefixcache_tap = mark
        except Exception:  # a class without a __dict__: its id stands in
            mark = (-id(layer), id(layer))
    return f"{os.getpid()}:{mark[0]}"


def _rows(
    inputs: Any, logits: Any, cache: Any, before: Any, n: int, batch: int
) -> list[dict[str, Any]]:
    """One entry per batch row: its KV offset before and after the call (``b``, ``a``), its
    right padding (``pad``: the row's last positions are padding, its logits not a real
    position's; ``pb``, when not 0: padding its KV held already, a later chunk of a
    right-padded prefill), its input token ids (``ids``), its last position's log-softmax
    (``lp``) and, where the server's scheduler says (:mod:`.identity`), the id of its
    request (``id``)."""
    import mlx.core as mx
    import numpy as np

    last = logits[:, -1].astype(mx.float32)
    lp = last - mx.logsumexp(last, axis=-1, keepdims=True)
    mx.eval(lp)
    data = np.asarray(lp, dtype=np.float32)
    layer = _layer(cache)
    after = _per_row(None if layer is None else layer.offset, batch)
    first = _per_row(before, batch)
    said = take_padding(n, batch)  # the scheduler's own columns, else the cache's padding
    pads = [p for _, p in said] if said else _pads(layer, batch) or [0] * batch
    # the padding its offset still counts (a rotating layer rolled it out: none)
    held = [h for h, _ in said] if said and not _rolls_padding(layer) else [0] * batch
    labels = identity.current_labels()
    if labels is not None and len(labels) != batch:
        labels = None  # the scheduler's rows are not this call's: no label beats a wrong one
    ids: list[list[int]] | None = None
    if inputs is not None and getattr(inputs, "ndim", 0) == 2 and "int" in str(inputs.dtype):
        ids = [[int(t) for t in row] for row in np.asarray(inputs).tolist()]
    out: list[dict[str, Any]] = []
    for i in range(batch):
        a = after[i] if after else (n if not cache else -1)
        b = first[i] if first else (a - n if a >= 0 else -1)
        if a >= 0 and b != a - n:  # a model that moved the offset before the wrapped call
            b = a - n  # (mlx-vlm's language models): the call's positions end at ``a``
        out.append(
            {
                "b": b,
                "a": a,
                "pad": pads[i],
                "ids": None if ids is None else ids[i],
                "lp": base64.b64encode(data[i].tobytes()).decode("ascii"),
            }
        )
        if held[i]:
            out[-1]["pb"] = held[i]
        if labels is not None:
            out[-1]["id"] = labels[i]
    return out


def _wrap(cls: type, sink: _Sink) -> None:
    original: Callable[..., Any] = cls.__call__
    if getattr(original, "__prefixcache_tap__", False):
        return
    sig = inspect.signature(original)
    name = f"{cls.__module__}.{cls.__qualname__}"

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        before = None
        if not depth:
            try:
                before = _offsets(sig.bind_partial(self, *args, **kwargs).arguments.get("cache"))
            except Exception:  # never raise into the server
                pass
        _depth.n = depth + 1
        try:
            out = original(self, *args, **kwargs)
        finally:
            _depth.n = depth
        if depth:  # called from inside another tapped call: that one records
            return out
        try:
            bound = sig.bind_partial(self, *args, **kwargs).arguments
            inputs = bound.get("inputs", args[0] if args else None)
            cache = bound.get("cache")
            logits = getattr(out, "logits", out)
            batch, n = int(logits.shape[0]), int(logits.shape[1])
            if inputs is not None and getattr(inputs, "ndim", 0) >= 2:
                n = int(inputs.shape[1])
            rows = _rows(inputs, logits, cache, before, n, batch)
            offset = max((r["a"] for r in rows), default=-1)
            sink.write(name, n, batch, offset, rows, _cache_key(cache))
        except Exception:  # never raise into the server
            pass
        return out

    __call__.__prefixcache_tap__ = True  # type: ignore[attr-defined]
    cls.__call__ = __call__  # type: ignore[method-assign]


#: The records file of :func:`install` (the identity hooks write their admissions there).
_SINK: _Sink | None = None


def install_identity() -> list[str]:
    """Install the scheduler hooks (:mod:`.identity`) on the modules imported now (and later),
    writing to :func:`install`'s file; a header line names them. Returns what was patched."""
    if _SINK is None:
        raise RuntimeError("install the tap first")
    sink = _SINK

    def header(done: list[str]) -> None:
        with sink.lock, open(sink.path, "a") as f:
            f.write(json.dumps({"identity": done, "pid": os.getpid()}) + "\n")

    families = (*identity.FAMILIES, identity_vlm.FAMILY, identity_omlx.FAMILY)
    done = identity.install(sink, header, families)  # a later import's patches: another line
    header(done)
    return done


def install(path: str | None = None, targets: Sequence[str] = DEFAULT_TARGETS) -> list[str]:
    """Wrap every importable target class; records go to ``path`` (default ``$PREFIXCACHE_TAP``).
    Returns the classes wrapped."""
    path = path or os.environ.get(ENV)
    if not path:
        raise RuntimeError(f"set ${ENV} to the file the tap records go to")
    global _SINK
    sink = _SINK = _Sink(path)
    done = []
    for target in targets:
        module, _, attr = target.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
        _wrap(cls, sink)
        done.append(target)
    sink.header(done)
    return done
