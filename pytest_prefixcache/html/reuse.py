"""The table of reuse against each reference: the token oracle, the snapshot-aware reference
and, for a block-granular design, the block reference; the one the engine declares (and its
efficiency is judged against) is marked."""

from __future__ import annotations

from html import escape

from ..output.report import Report
from ..output.summary import over_claims

__all__ = ["references_table"]

#: The references' names and what each allows, by key of ``Report.reuse_totals()``.
_REFERENCES = {
    "token": ("Token oracle", "any shared prefix, to the token: the correctness bound"),
    "snapshot": (
        "Snapshot-aware",
        "up to a boundary passed while prefilling an earlier prompt: message starts, image "
        "edges, prompt ends",
    ),
    "block": ("Block reference", "whole blocks of the token oracle's prefix"),
}


def references_table(report: Report) -> str:
    """Reuse against every reference side by side; the declared one is marked. No efficiency
    is shown when the engine over-claimed (the reuse bound failed)."""
    over = over_claims(report)
    rows = []
    for ref, (reused, reusable) in report.reuse_totals().items():
        title, what = _REFERENCES[ref]
        if ref == "block":
            what += f" ({report.block_size} tokens)"
        if ref == "snapshot" and report.starts_unknown:
            what += f"; message boundaries unknown on {report.starts_unknown} request(s)"
        eff = "not judged" if over else f"{reused / reusable:.1%}" if reusable else "n/a"
        mark = ' class="judged"' if ref == report.reference else ""
        judged_by = " (judged)" if ref == report.reference else ""
        rows.append(
            f'<tr{mark} data-reference="{ref}"><td class="name">{title}{judged_by}</td>'
            f"<td>{escape(what)}</td><td>{reusable}</td><td>{reused}</td><td>{eff}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>" for h in ("Reference", "What it allows", "Reusable", "Reused", "Efficiency")
    )
    return (
        f'<table class="configs references"><thead><tr>{head}</tr></thead>'
        f'<tbody>{"".join(rows)}</tbody></table><p class="caption">Reused: what the engine '
        "reported, capped at each reference's maximum per request. The efficiency above is "
        f"judged against {escape(report.judged_against)}, the engine's declared design.</p>"
    )
