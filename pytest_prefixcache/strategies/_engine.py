"""The strategies' arguments for one engine: what it says it supports (its ``supports_images``
and ``supports_namespaces`` attributes; both assumed when absent) keeps the generated requests
within it. The built-in suite and the benchmarks draw from the same arguments."""

from __future__ import annotations

from typing import Any

from ..traits import traits_of
from ._moves import MOVES
from ._streams import CLOSED_LOOP_SHARE

__all__ = ["IMAGE_MOVES", "capabilities", "stream_kwargs", "wave_kwargs"]

#: The moves that change a request's images (left out for an engine without images).
IMAGE_MOVES = ("replace", "swap", "reencode")


def capabilities(engine: object) -> tuple[bool, bool]:
    """(images, namespaces): what ``engine`` says it supports (``supports_images`` and
    ``supports_namespaces``; both assumed when absent)."""
    return (
        traits_of(engine).supports_images is not False,
        traits_of(engine).supports_namespaces is not False,
    )


def stream_kwargs(engine: object) -> dict[str, Any]:
    """``request_streams()`` arguments that stay within ``engine``'s capabilities, closed-loop
    in the share ``--prefixcache-verify`` draws (:data:`CLOSED_LOOP_SHARE`)."""
    images, namespaces = capabilities(engine)
    moves = [m for m in MOVES if (images or m not in IMAGE_MOVES)]
    moves = [m for m in moves if (namespaces or m != "namespace")]
    adapters = tuple(traits_of(engine).adapters)
    moves = [m for m in moves if (adapters or m != "adapter")]
    kwargs: dict[str, Any] = {"moves": tuple(moves), "closed_loop": CLOSED_LOOP_SHARE}
    if adapters:
        kwargs["adapters"] = adapters
    if not images:
        kwargs["max_images_per_message"] = 0
    if not namespaces:
        kwargs["namespaces"] = ("",)
    return kwargs


def wave_kwargs(engine: object) -> dict[str, Any]:
    """``request_waves()`` arguments that stay within ``engine``'s capabilities: those of
    :func:`stream_kwargs` without the streams' own knobs."""
    kwargs = stream_kwargs(engine)
    for closed_loop_only in ("closed_loop", "reply_tokens"):
        kwargs.pop(closed_loop_only, None)
    return kwargs
