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

from . import ENV

__all__ = ["DEFAULT_TARGETS", "install"]

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

    def write(self, cls: str, n: int, batch: int, offset: int, lp: bytes) -> None:
        with self.lock:
            rec = {
                "seq": self.seq,
                "cls": cls,
                "n": n,
                "batch": batch,
                "offset": offset,
                "pid": os.getpid(),
                "lp": base64.b64encode(lp).decode("ascii"),
            }
            self.seq += 1
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")


def _offset(cache: Any, n: int) -> int:
    """The KV offset after the call, from the first layer cache that has one: on a hybrid,
    layer 0 holds a recurrent state (``ArraysCache``, no offset); a rotating window's
    ``offset`` counts every position seen, not the ring's size. -1 when no layer has one."""
    if not cache:
        return n
    for layer in cache:
        off = getattr(layer, "offset", None)
        if off is None:
            continue
        try:
            return int(off)
        except TypeError:  # a batch cache: one offset per row
            import numpy as np

            return int(np.asarray(off).max())
    return -1


def _wrap(cls: type, sink: _Sink) -> None:
    original: Callable[..., Any] = cls.__call__
    if getattr(original, "__prefixcache_tap__", False):
        return
    sig = inspect.signature(original)
    name = f"{cls.__module__}.{cls.__qualname__}"

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        _depth.n = depth + 1
        try:
            out = original(self, *args, **kwargs)
        finally:
            _depth.n = depth
        if depth:  # called from inside another tapped call: that one records
            return out
        try:
            import mlx.core as mx
            import numpy as np

            bound = sig.bind_partial(self, *args, **kwargs).arguments
            inputs = bound.get("inputs", args[0] if args else None)
            logits = getattr(out, "logits", out)
            batch, n = int(logits.shape[0]), int(logits.shape[1])
            if inputs is not None and getattr(inputs, "ndim", 0) >= 2:
                n = int(inputs.shape[1])
            last = logits[0, -1].astype(mx.float32)
            lp = last - mx.logsumexp(last)
            mx.eval(lp)
            data = np.asarray(lp, dtype=np.float32).tobytes()
            sink.write(name, n, batch, _offset(bound.get("cache"), n), data)
        except Exception:  # never raise into the server
            pass
        return out

    __call__.__prefixcache_tap__ = True  # type: ignore[attr-defined]
    cls.__call__ = __call__  # type: ignore[method-assign]


def install(path: str | None = None, targets: Sequence[str] = DEFAULT_TARGETS) -> list[str]:
    """Wrap every importable target class; records go to ``path`` (default ``$PREFIXCACHE_TAP``).
    Returns the classes wrapped."""
    path = path or os.environ.get(ENV)
    if not path:
        raise RuntimeError(f"set ${ENV} to the file the tap records go to")
    sink = _Sink(path)
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
