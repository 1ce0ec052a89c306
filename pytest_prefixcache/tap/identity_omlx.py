"""Identity at the batch boundary for oMLX (flyto-mlx 0.7.0, package ``omlx``): which request
each batch row belongs to, read where its scheduler holds it, and the tie from that request to
the HTTP exchange.

The rows (``omlx.scheduler.Scheduler``, on the one MLX executor thread that runs
``Scheduler.step``): a request's prompt is prefilled outside mlx-lm's ``BatchGenerator``, alone
(``_do_external_prefill(request, ...)``, or one chunk per step with chunked prefill:
``_step_prefill_chunk(state)``, ``state.request``), all but its last token; then the last token
is inserted into the ``BatchGenerator`` (``batch_generator.insert``), whose batch classes
:mod:`.identity`'s mlx-lm hooks label with their rows' uids. The scheduler keeps
``uid_to_request_id`` for those uids, so during ``step`` each uid is named after its oMLX
request (:func:`._labels.row_label`): both halves of a request carry one label,
``PID:omlx:REQUEST_ID``.

The tie: oMLX's reply ``id`` is not its request id, but the engine admits the request in the
exchange's task (``EngineCore.add_request``, async, returns the request id), where the value of
the client's header (:data:`.identity_vllm.REQUEST_HEADER`, read by the FastAPI hook of
:mod:`.identity_vllm`) is known: the admission line ties the label to that value.

Not labelled (the ledger's inference stays for them): SpecPrefill's sparse prefill and the
VLM MTP decode (per-model settings off by default, not run here).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from ._labels import Writer, patch_plan, scoped
from .identity_vllm import _admitting
from .identity_vllm import _http as _header

__all__ = ["FAMILY", "OMLX_MODULES", "SCHEDULER", "label", "omlx_hooks"]

#: The modules whose import installs these hooks (``omlx.server`` imports FastAPI first).
OMLX_MODULES = ("omlx.server", "omlx.scheduler", "omlx.engine_core")
SCHEDULER = "omlx.Scheduler"


def label(request_id: str) -> str:
    """The label of every row of oMLX request ``request_id`` in this process."""
    return f"{os.getpid()}:omlx:{request_id}"


def _stepping(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Scheduler.step()``: the BatchGenerator's uids are named after their requests."""

    def names_of(self: Any, *args: Any, **kwargs: Any) -> Callable[[int], str | None]:
        table = self.uid_to_request_id

        def names(uid: int) -> str | None:
            rid = table.get(uid)
            return label(rid) if isinstance(rid, str) else None

        return names

    return scoped("names", names_of)(original)


def _alone(request_of: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A scheduler method whose forward calls prefill one request alone (one row)."""

    def labels(self: Any, *args: Any, **kwargs: Any) -> list[str]:
        return [label(request_of(*args, **kwargs).request_id)]

    return scoped("labels", labels)


def _request(request: Any, *args: Any, **kwargs: Any) -> Any:
    return request


def _state(state: Any, *args: Any, **kwargs: Any) -> Any:
    return state.request


def _adding(sink: Writer) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``async EngineCore.add_request(...) -> request id``: its label admitted with the header."""
    return _admitting(lambda request_id, client: sink.admit(label(request_id), client, SCHEDULER))


def omlx_hooks(sink: Writer) -> list[str]:
    """Install the hooks on the modules of :data:`OMLX_MODULES` imported now (FastAPI's
    header hook once oMLX's server module is: another FastAPI server needs no header)."""
    plan: list[tuple[str, str, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = [
        ("omlx.scheduler", "Scheduler", "step", _stepping),
        ("omlx.scheduler", "Scheduler", "_do_external_prefill", _alone(_request)),
        ("omlx.scheduler", "Scheduler", "_step_prefill_chunk", _alone(_state)),
        ("omlx.engine_core", "EngineCore", "add_request", _adding(sink)),
    ]
    if "omlx.server" in sys.modules:
        plan.append(("fastapi.applications", "FastAPI", "__call__", _header))
    return patch_plan(plan)


#: The family for :func:`.identity.install` (its modules, its hooks).
FAMILY: tuple[tuple[str, ...], Callable[[Writer], list[str]]] = (OMLX_MODULES, omlx_hooks)
