"""Markdown table of ``side_by_side.py`` results, as in the README.

Warm / limit is summed over the requests that reused something (the first request of a
workload has nothing to reuse); the worst warm / limit and warm / cold are per request. The
limit is defined in ``limits.py`` (new images encoded and the suffix prefilled over its prefix
KV already in place).

python benchmarks/table.py benchmarks/results/side_by_side_tiny.json [...large.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEAD = (
    "| size | workload | engine | reused / prompt | vs oracle | vs block oracle | cold | warm "
    "| cold / warm | warm / limit | worst warm / limit | warm > cold (worst) | resident |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def hits_ratio(requests: list[dict], key: str) -> float | None:
    """Warm time over ``key`` time, summed over the requests that reused something."""
    hits = [r for r in requests if r["cached_tokens"] and r.get(key) is not None]
    den = sum(r[key] for r in hits)
    return sum(r["warm_s"] for r in hits) / den if den else None


def rows(figures: dict) -> list[str]:
    out = []
    for wname, per_engine in figures["workloads"].items():
        for ename, result in per_engine.items():
            s, reqs = result["summary"], result["requests"]
            out.append(
                f"| {figures['size']} | {wname} | {ename} "
                f"| {s['cached_tokens']:,} / {s['prompt_tokens']:,} ({pct(s['efficiency'])}) "
                f"| {pct(s['vs_oracle'])} | {pct(s['vs_block_oracle'])} "
                f"| {s['cold_s']:.2f} s | {s['warm_s']:.2f} s | {s['cold_over_warm']:.2f}x "
                f"| {num(hits_ratio(reqs, 'limit_s'), '.2f')} "
                f"| {num(s.get('worst_warm_over_limit'), '.2f')} "
                f"| {s['warm_slower_than_cold']} of {len(reqs)} "
                f"({s['worst_warm_over_cold']:.2f}x) "
                f"| {s['max_resident_bytes'] / 1e6:.1f} MB |"
            )
    return out


def main(argv: list[str]) -> int:
    print(HEAD)
    for path in argv:
        print("\n".join(rows(json.loads(Path(path).read_text()))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
