"""Argument checks the strategies share: each raises ``InvalidArgument`` repeating the bad
value, when the strategy is built."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis.errors import InvalidArgument

from ._moves import SYSTEM_PROMPTS, StreamSpec

__all__ = ["int_arg", "range_arg", "stream_spec"]


def int_arg(name: str, value: object, lo: int, hi: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lo
        or (hi is not None and value > hi)
    ):
        bound = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
        raise InvalidArgument(f"{name}={value!r} is not an int {bound}")
    return value


def range_arg(lo_name: str, lo: int, hi_name: str, hi: int) -> None:
    if lo > hi:
        raise InvalidArgument(f"{lo_name}={lo!r} is larger than {hi_name}={hi!r}")


def stream_spec(
    namespaces: Sequence[str],
    max_new_tokens: int,
    max_images_per_message: int,
    adapters: Sequence[str] = (),
) -> StreamSpec:
    ns = (namespaces,) if isinstance(namespaces, str) else tuple(namespaces)
    if not ns or not all(isinstance(n, str) for n in ns) or len(set(ns)) != len(ns):
        raise InvalidArgument(f"namespaces={namespaces!r} must be distinct strings, at least one")
    int_arg("max_new_tokens", max_new_tokens, 0, 64)
    int_arg("max_images_per_message", max_images_per_message, 0, 8)
    ad = (adapters,) if isinstance(adapters, str) else tuple(adapters)
    if not all(isinstance(a, str) and a for a in ad) or len(set(ad)) != len(ad):
        raise InvalidArgument(f"adapters={adapters!r} must be distinct non-empty strings")
    return StreamSpec(ns, max_new_tokens, max_images_per_message, SYSTEM_PROMPTS, adapters=ad)


def usable_moves(
    moves: Sequence[str] | str, spec: StreamSpec, known: Sequence[str]
) -> tuple[str, ...]:
    """``moves`` checked against ``known``, without ``adapter`` when there are no adapters."""
    mv = (moves,) if isinstance(moves, str) else tuple(moves)
    if not mv or any(m not in known for m in mv):
        raise InvalidArgument(f"moves={moves!r} must be a non-empty subset of {tuple(known)}")
    kept = tuple(m for m in mv if m != "adapter" or spec.adapters)
    if not kept:
        raise InvalidArgument(f"moves={moves!r}: the adapter move needs adapters")
    return kept
