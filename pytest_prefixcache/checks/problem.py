"""The record every check returns: which check broke, a headline, details, where."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Problem"]


@dataclass(frozen=True)
class Problem:
    """One broken check: which check, a one-line headline, detail lines, where."""

    check: str
    headline: str
    details: tuple[str, ...] = ()
    position: int | None = None
