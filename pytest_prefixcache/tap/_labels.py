"""The state the scheduler hooks of :mod:`.identity` share: the labels of the forward call
running on this thread, where a right-padded prefill's rows really end (:func:`padded_prefill`,
:func:`take_padding`), one serial number per scheduler object, and the patching of a class
method once (nothing here raises into the server)."""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

__all__ = [
    "MARK",
    "PAD_MARK",
    "Make",
    "Writer",
    "current_labels",
    "local",
    "padded_prefill",
    "patch",
    "patch_plan",
    "row_label",
    "scoped",
    "serial",
    "serials",
    "take_padding",
]


class Writer(Protocol):
    def admit(self, label: str, reply_id: str, scheduler: str) -> None: ...


local = threading.local()
serials = iter(range(1, 1 << 62))


def current_labels() -> list[str] | None:
    """The labels of the rows of the forward call running on this thread, in row order; None
    when no scheduler hook said (an unknown server, or a call outside a batch). Labels a hook
    set for the next forward call alone (``local.once``) are used up by this call."""
    once = getattr(local, "once", None)
    local.once = None
    labels = getattr(local, "labels", None)
    if labels is None:
        labels = once
    return None if labels is None else list(labels)


def row_label(generator: int, uid: int) -> str:
    """The label of a ``BatchGenerator`` row: ``PID:GENERATOR:UID``, unless a scheduler hook
    named its uids after its own requests for the call running on this thread
    (``local.names``, uid -> label or None)."""
    names = getattr(local, "names", None)
    if names is not None:
        name = names(uid)
        if name is not None:
            return str(name)
    return f"{os.getpid()}:{generator}:{uid}"


def scoped(name: str, value_of: Callable[..., Any]) -> Make:
    """Wraps a method so that, while it runs on this thread, ``local.NAME`` holds
    ``value_of(*its arguments)`` (None when that raises: nothing raises into the server), and
    afterwards what it held before."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            before = getattr(local, name, None)
            try:
                setattr(local, name, value_of(*args, **kwargs))
            except Exception:
                setattr(local, name, None)
            try:
                return original(*args, **kwargs)
            finally:
                setattr(local, name, before)

        return run

    return make


def padded_prefill(where: Callable[..., Any]) -> Make:
    """Wraps a batch method whose forward calls prefill right-padded rows: ``where`` (given
    the method's arguments) says, before each run, how many columns of the padded prompt ran
    already and the column where each row's real tokens end (``(done, ends)``, or None: no
    right padding), for :func:`take_padding` to read. A cache's own ``_right_padding`` is a
    row's padding over the whole prefill: a row whose tokens end in an early chunk has no
    padding in that chunk (mlx-vlm 0.7's mixed warm/cold prefill keeps that chunk's logits
    as the row's first token's)."""

    def columns(*args: Any, **kwargs: Any) -> list[Any] | None:
        said = where(*args, **kwargs)
        return None if said is None else [int(said[0]), [int(e) for e in said[1]]]

    return scoped("columns", columns)


def take_padding(n: int, batch: int) -> list[tuple[int, int]] | None:
    """Per row of the forward call running on this thread (``n`` input positions), the
    padding already in its KV before the call and the padding among the call's positions,
    when a :func:`padded_prefill` hook described the batch (its columns then advance by
    ``n``); None when none did, or for another number of rows."""
    said = getattr(local, "columns", None)
    if not said or len(said[1]) != batch:
        return None
    done, ends = said
    said[0] = done + n
    return [(max(0, done - e), max(0, done + n - max(done, e))) for e in ends]


def serial(obj: Any) -> int:
    """A number of ``obj``'s own (a scheduler's generator), the same at every call."""
    mark = getattr(obj, "_prefixcache_serial", None)
    if not isinstance(mark, int):
        mark = next(serials)
        try:
            obj._prefixcache_serial = mark
        except Exception:
            return id(obj)
    return mark


Make = Callable[[Callable[..., Any]], Callable[..., Any]]
#: The mark of a method an identity hook wraps (another wrapper may mark its own, to stack).
MARK = "__prefixcache_identity__"
#: The mark of a :func:`padded_prefill` wrapper (it stacks on the label wrapper).
PAD_MARK = "__prefixcache_padding__"


def patch(cls: type, name: str, make: Make, mark: str = MARK) -> bool:
    """Replace ``cls.name`` by ``make(original)`` once (``mark`` says it is done); False when
    absent or done already."""
    original = getattr(cls, name, None)
    if original is None or getattr(original, mark, False):
        return False
    wrapped = functools.wraps(original)(make(original))
    setattr(wrapped, mark, True)
    setattr(cls, name, wrapped)
    return True


def patch_plan(plan: Iterable[tuple[str, str, str, Make]], mark: str = MARK) -> list[str]:
    """:func:`patch` each ``(module, class, method, make)`` whose module is imported (under
    ``mark``); returns ``module:Class.method`` for those patched now."""
    done: list[str] = []
    for module_name, cls_name, method, make in plan:
        cls = getattr(sys.modules.get(module_name), cls_name, None)
        if isinstance(cls, type) and patch(cls, method, make, mark):
            done.append(
                f"{module_name}:{cls_name}.{method}" + (" (padding)" if mark == PAD_MARK else "")
            )
    return done
