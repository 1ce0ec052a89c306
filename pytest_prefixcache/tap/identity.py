"""Which request each batch row belongs to, read where the server's scheduler holds it.

The tap's wrapper (:mod:`.wrap`) records one line per forward call; this module labels each of
the call's rows with the scheduler's own id for the request in that row, and writes one
admission line per request tying that id to the HTTP exchange (the reply's ``id``), so that
the reader (:mod:`.tracks`) attributes rows by identity instead of inferring it.

mlx-lm 0.32 (``mlx_lm.server``): its ``BatchGenerator`` hands each request a ``uid`` at
``insert_segments`` and keeps the rows' ``uids`` in row order on the batch whose forward is
running (``PromptProcessingBatch.prompt`` for prefill chunks, ``GenerationBatch._step`` for the
first token and every decode step). The server gives the request its reply id
(``chatcmpl-<uuid>``) in ``APIHandler.handle_completion``'s thread, and tokenizes the same
request object on its generation thread just before inserting it (``ResponseGenerator.
_tokenize``); a request it serves alone (``_serve_single``: images, a seed, ``--kv-bits``)
gets an id of its own. A row's label is ``PID:GENERATOR:UID`` (a server makes a new generator,
its uids starting at 0 again, after draining one).

Hooks are installed on the classes of the modules already imported when :func:`install` runs
(the launcher calls it after importing the server's module), and on those imported later (an
import hook); nothing raises into the server.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ._labels import PAD_MARK, current_labels, padded_prefill, patch_plan, scoped
from ._labels import Writer as _Writer
from ._labels import local as _local
from ._labels import row_label as _row_label
from ._labels import serial as _serial
from ._labels import serials as _serials
from .identity_lm030 import old_batch_generator_hooks
from .identity_vllm import REQUEST_HEADER, VLLM_MLX_MODULES, vllm_mlx_hooks

__all__ = ["FAMILIES", "REQUEST_HEADER", "Family", "current_labels", "install"]

#: The HTTP exchanges waiting for their scheduler id: id(request object) -> (object, reply id).
_pending: dict[int, tuple[Any, str]] = {}
_pending_lock = threading.Lock()


def _labelled(original: Callable[..., Any]) -> Callable[..., Any]:
    """A batch method that runs the model on ``self.uids``' rows: labels them meanwhile."""

    def labels(self: Any, *args: Any, **kwargs: Any) -> list[str]:
        gen = getattr(_local, "generator", 0)
        return [_row_label(gen, u) for u in self.uids]

    return scoped("labels", labels)(original)


def _in_generator(original: Callable[..., Any]) -> Callable[..., Any]:
    """``BatchGenerator._next``: the batches it runs belong to this generator."""

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = getattr(_local, "generator", 0)
        _local.generator = _serial(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            _local.generator = before

    return run


def _admitting(sink: _Writer) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        """``BatchGenerator.insert_segments``: the request being admitted gets its uids."""

        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            uids = original(self, *args, **kwargs)
            reply_id = getattr(_local, "admitting", None)
            _local.admitting = None
            try:
                if reply_id is not None and len(uids) == 1:
                    label = f"{os.getpid()}:{_serial(self)}:{uids[0]}"
                    sink.admit(label, reply_id, "mlx_lm.BatchGenerator")
            except Exception:
                pass
            return uids

        return run

    return make


def _http(original: Callable[..., Any]) -> Callable[..., Any]:
    """``APIHandler.handle_completion(request, ...)``: the request object's reply id."""

    def run(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        key = id(request)
        reply_id = getattr(self, "request_id", None)
        if isinstance(reply_id, str):
            with _pending_lock:
                _pending[key] = (request, reply_id)
        try:
            return original(self, request, *args, **kwargs)
        finally:
            with _pending_lock:
                _pending.pop(key, None)

    return run


def _reply_id(request: Any) -> str | None:
    with _pending_lock:
        entry = _pending.get(id(request))
    return entry[1] if entry is not None and entry[0] is request else None


def _tokenizing(original: Callable[..., Any]) -> Callable[..., Any]:
    """``ResponseGenerator._tokenize(tokenizer, request, args)``: the next insert admits it."""

    def run(self: Any, tokenizer: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, tokenizer, request, *args, **kwargs)
        _local.admitting = _reply_id(request)
        return out

    return run


def _single(sink: _Writer) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        """``ResponseGenerator._serve_single((rqueue, request, args), ...)``: one request
        alone; its calls' single row is labelled with an id of its own."""

        def run(self: Any, item: Any, *args: Any, **kwargs: Any) -> Any:
            before = getattr(_local, "labels", None)
            try:
                label = f"{os.getpid()}:single:{next(_serials)}"
                reply_id = _reply_id(item[1])
                if reply_id is not None:
                    sink.admit(label, reply_id, "mlx_lm.server single")
                _local.labels = [label]
            except Exception:
                _local.labels = None
            try:
                return original(self, item, *args, **kwargs)
            finally:
                _local.labels = before
                _local.admitting = None

        return run

    return make


def _prompt_columns(batch: Any, tokens: Any, *args: Any, **kw: Any) -> tuple[int, list[int]] | None:
    """mlx-lm's ``PromptProcessingBatch.prompt(tokens)``: right-pads the rows to the longest
    and runs them in chunks; each row's real tokens end at its length."""
    lengths = [len(t) for t in tokens]
    return (0, lengths) if lengths and min(lengths) < max(lengths) else None


def _mlx_lm(sink: _Writer) -> list[str]:
    gen, server = "mlx_lm.generate", "mlx_lm.server"
    padding = padded_prefill(_prompt_columns)
    return patch_plan([(gen, "PromptProcessingBatch", "prompt", padding)], PAD_MARK) + patch_plan(
        [
            (gen, "PromptProcessingBatch", "prompt", _labelled),
            (gen, "GenerationBatch", "_step", _labelled),
            (gen, "BatchGenerator", "_next", _in_generator),
            (gen, "BatchGenerator", "insert_segments", _admitting(sink)),
            (server, "APIHandler", "handle_completion", _http),
            (server, "ResponseGenerator", "_tokenize", _tokenizing),
            (server, "ResponseGenerator", "_serve_single", _single(sink)),
        ]
    )


def _mlx_lm_any(sink: _Writer) -> list[str]:
    """mlx-lm 0.31.2 on (:func:`_mlx_lm`), or its first BatchGenerator (0.30.x to 0.31.1:
    :mod:`.identity_lm030`)."""
    return old_batch_generator_hooks(_admitting(sink)) + _mlx_lm(sink)


#: Per server family: the modules its hooks patch, and the function that installs them on
#: those imported (returns what it patched; patching twice is a no-op).
Family = tuple[tuple[str, ...], Callable[[_Writer], list[str]]]
FAMILIES: Sequence[Family] = (
    (("mlx_lm.generate", "mlx_lm.server"), _mlx_lm_any),
    (VLLM_MLX_MODULES, vllm_mlx_hooks),
)


def _run(family: Callable[[_Writer], list[str]], sink: _Writer) -> list[str]:
    try:
        return family(sink)
    except Exception:  # a library version whose classes differ: no labels, the tap runs
        return []


class _AfterImport(importlib.abc.MetaPathFinder):
    """Installs a family's hooks when one of its modules is imported after :func:`install`
    (a server whose ``main`` imports ``mlx_lm.server`` itself); ``then`` hears what was
    patched."""

    def __init__(
        self, sink: _Writer, then: Callable[[list[str]], None], families: Sequence[Family]
    ) -> None:
        self.sink, self.then = sink, then
        self.names = {n: f for names, f in families for n in names}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        family = self.names.get(fullname)
        if family is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        original = getattr(loader, "exec_module", None)
        if original is None:
            return spec
        sink, then = self.sink, self.then

        def exec_module(module: Any) -> None:
            original(module)  # the module is in sys.modules already: the hooks find it
            done = _run(family, sink)
            if done:
                then(done)

        try:
            loader.exec_module = exec_module  # type: ignore[method-assign,union-attr]
        except Exception:
            pass
        return spec


def install(
    sink: _Writer,
    then: Callable[[list[str]], None] = lambda done: None,
    families: Sequence[Family] | None = None,
) -> list[str]:
    """Install every family's hooks (default :data:`FAMILIES`) on the modules imported now,
    and on its modules imported later (``then`` hears what those patched); returns what was
    patched now."""
    families = FAMILIES if families is None else families
    done: list[str] = []
    for _, family in families:
        done += _run(family, sink)
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(sink, then, families))
    return done
