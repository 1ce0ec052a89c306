"""Reuse against each reference, as the session report counts and shows it.

The report keeps, per reference, the tokens reused (each request's reported reuse, capped at
that reference's maximum) and the tokens it allowed: the token oracle (``reused_tokens`` of
``oracle_tokens``), the snapshot-aware reference and, for a block-granular design, whole
blocks (:mod:`pytest_prefixcache.checks.references`). The efficiency the verdict and
``--prefixcache-min-efficiency`` use is the one of the reference the engine declares
(``Report.reference``); the others are shown beside it.
"""

from __future__ import annotations

from typing import Protocol

from ..checks.oracle import Match
from ..checks.references import reference_name

__all__ = [
    "FIELDS",
    "MIXED",
    "Counts",
    "add_reuse",
    "efficiency_label",
    "judged",
    "references_line",
    "totals",
]

#: ``Report.reference`` of a matrix run whose configurations declare different designs.
MIXED = "per configuration"

#: The report's fields about the design and the other references (written to its JSON).
FIELDS = (
    "reference", "block_size", "snapshot_reused", "snapshot_tokens", "block_reused",
    "block_tokens", "starts_unknown", "last_kv",
)  # fmt: skip


class Counts(Protocol):
    """The report's reuse counters (:class:`.report_data.ReportData` has them): what this module
    reads and adds to, so that it needs no import of the report."""

    reference: str
    block_size: int | None
    reused_tokens: int
    oracle_tokens: int
    over_claims: int
    snapshot_reused: int
    snapshot_tokens: int
    block_reused: int
    block_tokens: int
    starts_unknown: int


_SHORT = {"token": "token oracle", "snapshot": "snapshot-aware"}


def add_reuse(report: Counts, cached_tokens: int, match: Match) -> None:
    """Count one request's reported reuse against every reference ``match`` carries."""
    report.reused_tokens += min(cached_tokens, match.max_reuse)
    report.over_claims += match.exceeded_by(cached_tokens)  # the reuse check's own test
    report.oracle_tokens += match.max_reuse
    if match.snapshot is not None:
        report.snapshot_reused += min(cached_tokens, match.snapshot)
        report.snapshot_tokens += match.snapshot
    if match.block is not None:
        report.block_reused += min(cached_tokens, match.block)
        report.block_tokens += match.block


def totals(report: Counts) -> dict[str, tuple[int, int]]:
    """reference -> (tokens reused, tokens it allowed); ``"block"`` only for a block size."""
    out = {
        "token": (report.reused_tokens, report.oracle_tokens),
        "snapshot": (report.snapshot_reused, report.snapshot_tokens),
    }
    if report.block_size is not None:
        out["block"] = (report.block_reused, report.block_tokens)
    return out


def judged(report: Counts) -> tuple[int, int]:
    """(reused, reusable) of the declared reference (the token oracle's when designs differ
    per configuration)."""
    all_ = totals(report)
    return all_.get(report.reference, all_["token"])


def efficiency_label(report: Counts) -> str:
    """The reference the report's efficiency is judged against, in words."""
    if report.reference == MIXED:
        return "the token oracle (the configurations declare different designs)"
    return "the " + reference_name(report.reference, report.block_size)


def references_line(report: Counts) -> str | None:
    """Reuse against every reference side by side (None when nothing was reusable)."""
    if report.oracle_tokens == 0:
        return None
    parts = []
    for ref, (reused, reusable) in totals(report).items():
        label = _SHORT.get(ref) or f"blocks of {report.block_size}"
        eff = f"{reused / reusable:.1%}" if reusable else "n/a"
        parts.append(f"{label} {eff} ({reused} of {reusable})")
    line = "reuse per reference: " + ", ".join(parts)
    line += f"; judged against {efficiency_label(report)}"
    if report.starts_unknown:
        line += f"; message boundaries unknown on {report.starts_unknown} request(s)"
    return line
