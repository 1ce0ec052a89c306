"""Identity at the batch boundary for vllm-mlx 0.6.0 and its fork rapid-mlx 0.16.10 (package
``rapid_mlx``, the same classes and methods where these hooks read): which request each batch
row belongs to, read where its schedulers hold it, and the tie from that request to the HTTP
exchange.

The tie: the tap's client sends each request with a header of its own
(:data:`REQUEST_HEADER`, a fresh uuid). vllm-mlx's reply ``id`` is drawn after generation
(``ChatCompletionResponse``'s default), so it cannot be tied at admission; the header can.
``FastAPI.__call__`` puts the header's value in a context variable for the exchange's task;
the engine admits the request in that task (``EngineCore.add_request`` for text,
``MLLMScheduler.add_request_async`` for ``--mllm``), which returns the engine's request id:
that id is tied to the header's value.

The rows, text (``vllm_mlx.scheduler.Scheduler``): requests go into mlx-lm's own
``BatchGenerator`` (``Scheduler._schedule_waiting`` inserts them and keeps
``uid_to_request_id``); its batch classes are labelled by :mod:`.identity`'s mlx-lm hooks
(``PID:GENERATOR:UID``), and the scheduled requests' ``batch_uid`` give the same label here.

The rows, ``--mllm`` (``vllm_mlx.mllm_batch_generator.MLLMBatchGenerator``): ``insert`` gives
each ``MLLMBatchRequest`` its ``uid``; ``_process_prompts(requests)`` prefills the requests one
at a time (a batch of one row per forward call, in the order it iterates ``requests``: every
model call inside an iteration is that request's), and ``_step`` decodes ``active_batch``'s
rows in ``active_batch.uids`` order. Chunked prefill (``install_chunked_prefill_mllm``
replaces the generator's ``_next`` on the instance) runs each chunk of the one request it
prefills right after ``_language_model_kwargs(request, ...)``: that call labels the next
forward call alone. rapid-mlx's ``_process_prompts`` drives ``_process_prompt_steps(requests)``
to its end with the same list (its cooperative prefill, with ``--completion-batch-size 1``
only, is not labelled).

A request is admitted (a line in the tap's file) once both its label and its header's value
are known, whichever comes first: the engine may insert a request before ``add_request``
returns its id."""

from __future__ import annotations

import contextvars
import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ._labels import MARK, Writer, local, patch_plan, scoped, serial

__all__ = ["REQUEST_HEADER", "VLLM_MLX_MODULES", "vllm_mlx_hooks"]

#: The header the tap's client sends with every request: a value of its own per request.
REQUEST_HEADER = "X-Prefixcache-Request"
_HEADER_KEY = REQUEST_HEADER.lower().encode("ascii")

#: The packages: vllm-mlx's, and rapid-mlx's (0.16.10 renamed it; ``vllm_mlx`` is its shim).
_PACKAGES = ("vllm_mlx", "rapid_mlx")
_MODULES = ("engine_core", "scheduler", "mllm_scheduler", "mllm_batch_generator")
#: The modules whose import installs these hooks.
VLLM_MLX_MODULES = (
    "fastapi.applications",
    *(f"{package}.{name}" for package in _PACKAGES for name in _MODULES),
)

_exchange: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "prefixcache_exchange", default=None
)
_lock = threading.Lock()
_client: dict[str, str] = {}  # engine request id -> the header's value
_label: dict[str, tuple[str, str]] = {}  # engine request id -> (row label, scheduler)


def _tie(sink: Writer, request_id: str, *, client: str | None = None, label: Any = None) -> None:
    """One side of a request's admission; writes it when both sides are known."""
    with _lock:
        if client is not None:
            _client[request_id] = client
        if label is not None:
            _label[request_id] = label
        if request_id not in _client or request_id not in _label:
            return
        value = _client.pop(request_id)
        row, by = _label.pop(request_id)
    sink.admit(row, value, by)


def _http(original: Callable[..., Any]) -> Callable[..., Any]:
    """``FastAPI.__call__(scope, receive, send)``: the exchange's header, for its task."""

    async def run(self: Any, scope: Any, receive: Any, send: Any) -> Any:
        token = None
        try:
            if scope.get("type") == "http":
                for key, value in scope.get("headers") or ():
                    if key.lower() == _HEADER_KEY:
                        token = _exchange.set(value.decode("latin-1"))
                        break
        except Exception:
            token = None
        try:
            return await original(self, scope, receive, send)
        finally:
            if token is not None:
                _exchange.reset(token)

    return run


def _admitting(
    admit: Callable[[str, str], None],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A hook for an engine's ``async add_request(...) -> request id``, run in the exchange's
    task: ``admit(request id, the header's value)`` once it returns (oMLX's too)."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            client = _exchange.get()
            request_id = await original(self, *args, **kwargs)
            try:
                if client is not None and isinstance(request_id, str):
                    admit(request_id, client)
            except Exception:
                pass
            return request_id

        return run

    return make


def _adding(sink: Writer) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """vllm-mlx's admission: the client's side of :func:`_tie`."""
    return _admitting(lambda request_id, client: _tie(sink, request_id, client=client))


def _scheduled(sink: Writer) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        """``Scheduler._schedule_waiting()``: the requests it inserted into mlx-lm's
        ``BatchGenerator``, each under ``batch_uid``."""

        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            scheduled = original(self, *args, **kwargs)
            try:
                gen = serial(self.batch_generator)
                for request in scheduled or ():
                    uid = getattr(request, "batch_uid", None)
                    if isinstance(uid, int):
                        label = (f"{os.getpid()}:{gen}:{uid}", "vllm_mlx.Scheduler")
                        _tie(sink, request.request_id, label=label)
            except Exception:
                pass
            return scheduled

        return run

    return make


def _inserting(sink: Writer) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        """``MLLMBatchGenerator.insert(requests)``: each request's ``uid``."""

        def run(self: Any, requests: Any, *args: Any, **kwargs: Any) -> Any:
            uids = original(self, requests, *args, **kwargs)
            try:
                gen = serial(self)
                for req in requests:
                    row = f"{os.getpid()}:{gen}:{req.uid}"
                    req._prefixcache_label = row
                    _tie(sink, req.request_id, label=(row, "vllm_mlx.MLLMBatchGenerator"))
            except Exception:
                pass
            return uids

        return run

    return make


class _Each(list):  # type: ignore[type-arg]
    """The requests of ``_process_prompts``: while it runs, iterating them labels the forward
    calls that follow with the request just handed out (its prefill runs alone, one row).
    vllm-mlx 0.6.0 keeps this very list as the batch's ``requests`` (``MLLMBatch(requests=
    requests)``) and iterates it again at every decode step (``_batch_rope_deltas``, the
    responses): once ``_process_prompts`` returned (``done``), an iteration labels nothing,
    or its last request's label would stay on the thread and name the next forward call
    outside any hook, a chunked prefill's (whose ``_language_model_kwargs`` label it hid)."""

    done = False

    def __iter__(self) -> Iterator[Any]:
        for req in list.__iter__(self):
            if not self.done:
                local.labels = _own(req)
            yield req


def _own(req: Any) -> list[str] | None:
    label = getattr(req, "_prefixcache_label", None)
    return [label] if isinstance(label, str) else None


def _prompts(original: Callable[..., Any]) -> Callable[..., Any]:
    """``MLLMBatchGenerator._process_prompts(requests)``: one request at a time."""

    def run(self: Any, requests: Any, *args: Any, **kwargs: Any) -> Any:
        before = getattr(local, "labels", None)
        try:
            each = _Each(requests)
        except Exception:
            each = requests
        try:
            return original(self, each, *args, **kwargs)
        finally:
            local.labels = before
            if isinstance(each, _Each):
                each.done = True
            if each is not requests:
                requests[:] = list.__iter__(each)  # its removals are the caller's

    return run


def _decoding(original: Callable[..., Any]) -> Callable[..., Any]:
    """``MLLMBatchGenerator._step(input_tokens, ...)``: ``active_batch``'s rows in order."""

    def labels(self: Any, *args: Any, **kwargs: Any) -> list[str]:
        gen = serial(self)
        return [f"{os.getpid()}:{gen}:{u}" for u in self.active_batch.uids]

    return scoped("labels", labels)(original)


def _kwargs(original: Callable[..., Any]) -> Callable[..., Any]:
    """``MLLMBatchGenerator._language_model_kwargs(request, ...)`` (a staticmethod): the
    forward call that follows is ``request``'s alone."""

    def run(request: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(request, *args, **kwargs)
        local.once = _own(request)
        return out

    return run


def _static(cls: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """:func:`patch` for a staticmethod (it stays one)."""
    raw = cls.__dict__.get(name)
    if not isinstance(raw, staticmethod):
        return False
    inner = raw.__func__
    if getattr(inner, MARK, False):
        return False
    wrapped = functools.wraps(inner)(make(inner))
    setattr(wrapped, MARK, True)
    setattr(cls, name, staticmethod(wrapped))
    return True


def vllm_mlx_hooks(sink: Writer) -> list[str]:
    """Install the hooks on the modules of :data:`VLLM_MLX_MODULES` imported now (the HTTP
    one only once a vllm_mlx module is: another FastAPI server needs no header)."""
    if not any(name.split(".")[0] in _PACKAGES for name in sys.modules):
        return []
    plan: list[tuple[str, str, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = [
        ("fastapi.applications", "FastAPI", "__call__", _http)
    ]
    for package in _PACKAGES:  # a module of the shim is the package's own: patched once
        plan += [
            (f"{package}.engine_core", "EngineCore", "add_request", _adding(sink)),
            (f"{package}.mllm_scheduler", "MLLMScheduler", "add_request_async", _adding(sink)),
            (f"{package}.scheduler", "Scheduler", "_schedule_waiting", _scheduled(sink)),
            (f"{package}.mllm_batch_generator", "MLLMBatchGenerator", "insert", _inserting(sink)),
            (f"{package}.mllm_batch_generator", "MLLMBatchGenerator", "_process_prompts", _prompts),
            (f"{package}.mllm_batch_generator", "MLLMBatchGenerator", "_step", _decoding),
        ]
    done = patch_plan(plan)
    for package in _PACKAGES:
        module_name = f"{package}.mllm_batch_generator"
        gen = getattr(sys.modules.get(module_name), "MLLMBatchGenerator", None)
        if isinstance(gen, type) and _static(gen, "_language_model_kwargs", _kwargs):
            done.append(f"{module_name}:MLLMBatchGenerator._language_model_kwargs")
    return done
