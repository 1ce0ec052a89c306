"""A matrix run's rows in the session report: one per engine configuration, and the worst."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["ORDER", "config_lines", "worst"]

#: Verdicts from best to worst; ``error``: the configuration's engine could not be built.
ORDER = ("pass", "partial", "incomplete", "inconclusive", "fail", "error")


def worst(verdicts: Iterable[str]) -> str:
    return max(
        verdicts, key=lambda v: ORDER.index(v) if v in ORDER else len(ORDER), default="incomplete"
    )


def config_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The terminal's verdict rows, one per configuration."""
    width = max(len(str(r["name"])) for r in rows)
    out = [f"configurations: {len(rows)}"]
    for r in rows:
        by = r.get("failures_by_check") or {}
        fails = ", ".join(f"{k}: {v}" for k, v in sorted(by.items())) or "none"
        detail = (
            f"engine could not be built: {r['engine_error']}"
            if r.get("engine_error")
            else f"{r.get('requests', 0)} requests, {r.get('cache_hits', 0)} with cache hits, "
            f"failures: {fails}"
        )
        out.append(f"  {str(r['name']).ljust(width)}  {str(r['verdict']).upper():<10} {detail}")
    return out
