"""The state the scheduler hooks of :mod:`.identity` share: the labels of the forward call
running on this thread, one serial number per scheduler object, and the patching of a class
method once (nothing here raises into the server)."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

__all__ = [
    "MARK",
    "Make",
    "Writer",
    "current_labels",
    "local",
    "patch",
    "patch_plan",
    "serial",
    "serials",
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


def patch_plan(plan: Iterable[tuple[str, str, str, Make]]) -> list[str]:
    """:func:`patch` each ``(module, class, method, make)`` whose module is imported; returns
    ``module:Class.method`` for those patched now."""
    done: list[str] = []
    for module_name, cls_name, method, make in plan:
        cls = getattr(sys.modules.get(module_name), cls_name, None)
        if isinstance(cls, type) and patch(cls, method, make):
            done.append(f"{module_name}:{cls_name}.{method}")
    return done
