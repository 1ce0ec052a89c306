"""Which request each batch row belongs to, for mlx_vlm.server (mlx-vlm 0.7): the hooks of
:mod:`.identity` for its continuous batching.

mlx-vlm's ``BatchGenerator`` (``mlx_vlm.generate.ar``) hands each request a ``uid`` at
``insert`` and keeps the rows' ``uids`` in row order on the batch whose forward is running:
``PromptProcessingBatch.prompt_step`` (a prefill chunk), ``PromptProcessingBatch.generate``
(the prompt's last chunk and first token) and ``GenerationBatch._step`` (every decode step). Its
server inserts each request on one GPU thread (``ResponseGenerator._run``) and hands the uid
back to the HTTP thread that called ``ResponseGenerator.generate`` (``GenerationContext.uid``).
The reply's ``id`` (``chatcmpl-<uuid4>``) is made only when the reply is written, so the
admission line is written there: the FastAPI app's ``__call__`` keeps a copy of a chat
completion's reply body as it goes out and, before the part that completes it is sent, reads its
``id`` and ties it to the uid its HTTP thread got (a context variable both share). The part
that completes the body is the one reaching its ``content-length``: the server's
``@app.middleware("http")`` streams the reply as the whole body, then an empty last part, and
a client holding the declared length does not wait for that one (an admission written only
then came after the client's look-up, which guessed). A streamed reply (not
JSON) is left to the ledger's inference.
"""

from __future__ import annotations

import contextvars
import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from ._labels import PAD_MARK, padded_prefill, patch_plan
from ._labels import Writer as _Writer
from ._labels import patch as _patch
from ._labels import serial as _serial
from .identity import _in_generator, _labelled

__all__ = ["FAMILY"]

#: The HTTP exchange being served in this context: what its thread learned (``label``).
_exchange: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "prefixcache_exchange", default=None
)
#: uid -> its label, from ``insert`` (the GPU thread) to ``generate`` (the HTTP thread).
_inserted: dict[int, str] = {}
_inserted_lock = threading.Lock()
SCHEDULER = "mlx_vlm.BatchGenerator"
#: A reply body longer than this is not read for its id (the ledger infers that request's rows).
MAX_BODY = 1 << 24
#: The mark of the reply-id wrapper of ``FastAPI.__call__`` (see :func:`._labels.patch`).
REPLY_MARK = "__prefixcache_reply_id__"


def _inserting(original: Callable[..., Any]) -> Callable[..., Any]:
    """``BatchGenerator.insert``: each uid's label, for the HTTP thread waiting for it."""

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        uids = original(self, *args, **kwargs)
        try:
            with _inserted_lock:
                for uid in uids:
                    _inserted[int(uid)] = f"{os.getpid()}:{_serial(self)}:{uid}"
        except Exception:
            pass
        return uids

    return run


def _generating(original: Callable[..., Any]) -> Callable[..., Any]:
    """``ResponseGenerator.generate``: the uid the GPU thread gave this exchange's request."""

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        try:
            holder = _exchange.get()
            uid = getattr(out[0], "uid", None)
            if holder is not None and isinstance(uid, int):
                with _inserted_lock:
                    label = _inserted.pop(uid, None)
                if label is not None:
                    holder["label"] = label
        except Exception:
            pass
        return out

    return run


def _columns(batch: Any, *args: Any, **kwargs: Any) -> tuple[int, list[int]] | None:
    """A ``PromptProcessingBatch``'s right-padded prefill (its mixed warm/cold rows: each
    row's suffix right-padded to the longest): the columns run so far and each row's real end
    (its suffix length); None when its rows are left-padded."""
    pads = getattr(batch, "_right_pad_per_row", None)
    if not pads or not any(pads):
        return None
    return int(batch._processed_prompt_columns), [int(n) for n in batch._suffix_lens]


def _content_length(headers: Any) -> list[int]:
    """An ASGI start message's ``content-length`` as a one-item list ([] when absent)."""
    for name, value in headers:
        if bytes(name).lower() == b"content-length":
            return [int(bytes(value))]
    return []


def _replying(sink: _Writer) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        """``FastAPI.__call__``: a chat completion's reply id, admitted before it is sent."""

        async def call(self: Any, scope: Any, receive: Any, send: Any) -> None:
            path = str(scope.get("path", "")) if isinstance(scope, dict) else ""
            if scope.get("type") != "http" or not path.endswith("/chat/completions"):
                return await original(self, scope, receive, send)
            holder: dict[str, str] = {}
            token = _exchange.set(holder)
            body: list[bytes] = []
            length: list[int] = []  # the declared content-length, when there is one

            async def sending(message: Any) -> None:
                try:  # a copy of the body; the admission before the part completing it
                    kind = message.get("type")
                    if kind == "http.response.start":
                        length[:] = _content_length(message.get("headers") or ())
                    elif kind == "http.response.body" and "label" in holder:
                        body.append(bytes(message.get("body", b"")))
                        got = sum(map(len, body))
                        if got > MAX_BODY:
                            holder.pop("label")
                        elif not message.get("more_body", False) or (length and got >= length[0]):
                            reply = json.loads(b"".join(body) or b"null")
                            label = holder.pop("label")  # once
                            if isinstance(reply, dict) and isinstance(reply.get("id"), str):
                                sink.admit(label, reply["id"], SCHEDULER)
                except Exception:  # never raise into the server (a stream is no JSON)
                    pass
                await send(message)

            try:
                return await original(self, scope, receive, sending)
            finally:
                _exchange.reset(token)

        return call

    return make


def _mlx_vlm(sink: _Writer) -> list[str]:
    ar, gen = "mlx_vlm.generate.ar", "mlx_vlm.server.generation"
    done = patch_plan(
        [
            (ar, "PromptProcessingBatch", "prompt_step", _labelled),
            (ar, "PromptProcessingBatch", "generate", _labelled),
            (ar, "GenerationBatch", "_step", _labelled),
            (ar, "BatchGenerator", "_next", _in_generator),
            (ar, "BatchGenerator", "insert", _inserting),
            (gen, "ResponseGenerator", "generate", _generating),
        ]
    )
    padding = padded_prefill(_columns)
    done += patch_plan(
        [(ar, "PromptProcessingBatch", m, padding) for m in ("prompt_step", "generate")],
        PAD_MARK,
    )
    fastapi = sys.modules.get("fastapi.applications")
    app = getattr(fastapi, "FastAPI", None) if gen in sys.modules else None
    # mlx-vlm's app only; its own mark: it stacks on vllm-mlx's header reader, neither
    # displacing the other
    if isinstance(app, type) and _patch(app, "__call__", _replying(sink), mark=REPLY_MARK):
        done.append("fastapi.applications:FastAPI.__call__ (reply id)")
    return done


#: The modules these hooks patch, and the function that installs them (see ``FAMILIES``).
FAMILY: tuple[tuple[str, ...], Callable[[_Writer], list[str]]] = (
    ("mlx_vlm.generate.ar", "mlx_vlm.server.generation", "fastapi.applications"),
    _mlx_vlm,
)
