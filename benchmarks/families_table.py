"""The Markdown table of ``families_side_by_side.py``'s results JSON: one row per family,
workload and engine (docs/benchmarks.md renders it through ``benchmarks_page.py``)."""

from __future__ import annotations

from typing import Any

__all__ = ["HEAD", "TARGET_HEAD", "markdown", "pct", "targets"]


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


HEAD = (
    "| family | workload | engine | reused / prompt | vs token oracle | vs snapshot-aware "
    "| requests short of snapshot-aware | cold | warm | cold / warm | max \\|cached - cold\\| |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def markdown(figures: dict[str, Any]) -> str:
    """The table: one row per family, workload and engine."""
    lines = [HEAD]
    for fname, fam in figures["families"].items():
        for wname, per_engine in fam["workloads"].items():
            for ename, result in per_engine.items():
                if "error" in result:  # the first clause (the JSON has all of it)
                    error = result["error"].split(": the render")[0].replace("|", "\\|")
                    lines.append(f"| {fname} | {wname} | {ename} | failed: {error} |" + " |" * 7)
                    continue
                s, n = result["summary"], len(result["requests"])
                vs_snap = (
                    "n/a" if s["snapshot_ref"] is None
                    else f"{pct(s['vs_snapshot'])} of {s['snapshot_ref']:,}"
                )  # fmt: skip
                short = (
                    "n/a" if s["snapshot_ref"] is None
                    else f"{len(s['short_of_snapshot'])} of {n}"
                )  # fmt: skip
                diff = "-" if s["max_abs_diff"] is None else f"{s['max_abs_diff']:.3g}"
                lines.append(
                    f"| {fname} | {wname} | {ename} "
                    f"| {s['cached_tokens']:,} / {s['prompt_tokens']:,} ({pct(s['efficiency'])}) "
                    f"| {pct(s['vs_oracle'])} of {s['oracle_max']:,} "
                    f"| {vs_snap} | {short} "
                    f"| {s['cold_s']:.2f} s | {s['warm_s']:.2f} s "
                    f"| {s['cold_over_warm']:.2f}x | {diff} |"
                )
    return "\n".join(lines)


TARGET_HEAD = (
    "| family | workload | passes | reference warm | fastest peer warm "
    "| reference / fastest peer | reference reuse vs snapshot-aware | more than every peer |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- |"
)


def targets(figures: dict[str, Any]) -> str:
    """The issue's warm-time target per family and workload: the reference engine's warm total
    against the fastest peer's (``target.warm_over_best_peer`` in the JSON)."""
    lines = [TARGET_HEAD]
    for fname, fam in figures["families"].items():
        for wname, t in fam["target"].items():
            if t is None:
                continue
            ours = fam["workloads"][wname]["reference"]["summary"]["warm_s"]
            best = t["best_peer_warm"]
            peer = "-" if best is None else f"{best['engine']}: {best['warm_s']:.2f} s"
            ratio = t["warm_over_best_peer"]
            passes = fam.get("passes", {}).get(wname, figures.get("repeats", "-"))
            lines.append(
                f"| {fname} | {wname} | {passes} | {ours:.2f} s | {peer} "
                f"| {'-' if ratio is None else f'{ratio:.2f}'} | {pct(t['vs_snapshot'])} "
                f"| {'yes' if t['more_than_every_peer'] else 'no'} |"
            )
    return "\n".join(lines)
