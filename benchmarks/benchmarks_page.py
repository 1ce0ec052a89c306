"""Generate docs/benchmarks.md's figure tables from ``benchmarks/results/*.json``.

    python benchmarks/benchmarks_page.py          # rewrite the generated blocks
    python benchmarks/benchmarks_page.py --check  # exit 1 when one is stale, write nothing

Each block sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in the page and is
rendered by ``RENDERERS[NAME]`` from the JSON the benchmark's command wrote (the command stays
beside the block, in the page). tests/test_benchmarks_page.py fails when a block is stale, so a
figure in the page is the one its JSON holds. Prose around a block is not generated: it cites
no figure the block already shows.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
BLOCK = re.compile(r"(<!-- bench:(\w+) -->\n)(.*?)(\n<!-- /bench:\2 -->)", re.S)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import table as side_by_side_table  # noqa: E402


def _json(name: str) -> Any:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def _s(x: float) -> str:
    return f"{x:.3g} s"


def prefill() -> str:
    """Cold vs warm after one changed late image (benchmarks/prefill.py)."""
    lines = [
        "| model | cold | warm | limit | suffix-only | cached tokens | cold / warm "
        "| warm / limit | warm / suffix-only |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in ("prefill_tiny.json", "prefill_large.json"):
        d = _json(name)
        lines.append(
            f"| {d['model']} | {_s(d['cold_s'])} | {_s(d['warm_s'])} | {_s(d['limit_s'])} "
            f"| {_s(d['suffix_only_s'])} | {d['cached_tokens']:,} of {d['prompt_tokens']:,} "
            f"| {d['cold_over_warm']:.1f}x | {d['warm_over_limit']:.2f} "
            f"| {d['warm_over_suffix']:.1f} |"
        )
    return "\n".join(lines)


def side_by_side() -> str:
    """The reference engine beside mlx-vlm APC and mlx-lm (benchmarks/side_by_side.py)."""
    rows = [
        r
        for n in ("tiny", "large")
        for r in side_by_side_table.rows(_json(f"side_by_side_{n}.json"))
    ]
    return "\n".join([side_by_side_table.HEAD, *rows])


def _ms(x: float) -> str:
    return f"{x * 1000:+.2f}"


def no_reuse() -> str:
    """A request with nothing to reuse, cached against uncached (benchmarks/no_reuse.py)."""
    lines = [
        "| size | engine | workload | prompt tokens | uncached | cached | cached / uncached "
        "| cached - uncached, paired: median (quartiles) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    runs = (
        ("tiny", "current", "no_reuse_tiny.json"),
        ("tiny", "b9df58e (before)", "no_reuse_tiny_before.json"),
        ("large", "current", "no_reuse_large.json"),
    )
    for size, engine, name in runs:
        for workload, r in _json(name)["requests"].items():
            low, median, high = r["paired_diff_quartiles_s"]
            lines.append(
                f"| {size} | {engine} | {workload} | {r['prompt_tokens']:,} "
                f"| {r['cold_s'] * 1000:,.1f} ms | {r['cached_s'] * 1000:,.1f} ms "
                f"| {r['cached_over_cold']:.3f} | {_ms(median)} ms ({_ms(low)}, {_ms(high)}) |"
            )
    return "\n".join(lines)


def families() -> str:
    """Side by side on hybrid and sliding-window models (benchmarks/families_side_by_side.py)."""
    import families_side_by_side  # numpy and the workloads: only when this block is rendered

    return families_side_by_side.markdown(_json("families_side_by_side.json"))


def families_hybrid() -> str:
    """The hybrid again, after the kernel and cut changes (families_side_by_side.py --family
    hybrid --repeats 3)."""
    import families_side_by_side

    return families_side_by_side.markdown(
        _json("families_side_by_side_hybrid/families_side_by_side.json")
    )


def families_windows() -> str:
    """The sliding-window and KV-shared families beside every peer that installs here
    (families_side_by_side.py --family sliding-window --family kv-shared)."""
    import families_side_by_side

    return families_side_by_side.markdown(_json(f"{WINDOWS}/families_side_by_side.json"))


def families_targets() -> str:
    """The reference engine's warm time over the fastest peer's, per family and workload, from
    the latest run of each family (families_side_by_side.py's ``target``)."""
    import families_table

    runs = [
        _json("families_side_by_side_hybrid/families_side_by_side.json"),
        _json(f"{WINDOWS}/families_side_by_side.json"),
        _json(f"{WINDOWS}_growing_chat/families_side_by_side.json"),  # three passes of one
    ]
    merged: dict[str, Any] = {}
    for run in runs:  # a later run's workload replaces an earlier one's
        for name, fam in run["families"].items():
            into = merged.setdefault(name, {"workloads": {}, "target": {}, "passes": {}})
            for w in fam["workloads"]:
                into["workloads"][w] = fam["workloads"][w]
                into["target"][w] = fam["target"][w]
                into["passes"][w] = run["repeats"]
    return families_table.targets({"families": merged})


def families_speed() -> str:
    """The default verification on tiny-qwen2-vl and tiny-qwen3.5-vl in one session
    (families_verify.py --models tiny-qwen2-vl,tiny-qwen3.5-vl)."""
    import families_verify

    runs = (
        "families/speed/families.json",
        "families/speed2/families.json",
        "families/speed_nodb/families.json",
        "families/speed_compiled/families.json",
        "families/speed_compiled2/families.json",
    )
    return families_verify.markdown([row for run in runs for row in _json(run)])


WINDOWS = "families_side_by_side_windows"


def failing_runs() -> str:
    """What a failing run costs, with and without the shrink budget (failing_runs.py)."""
    import failing_runs as runs

    return runs.markdown(_json("failing_runs.json")["runs"])


def verify_cost() -> str:
    """What verification costs, in-process and over HTTP (benchmarks/verify_throughput.py)."""
    import verify_throughput

    return verify_throughput.markdown(_json("verify_cost.json"))


def parallel_streams() -> str:
    """Parallel streams on one server, per engine and round (verify_throughput.py --parallel)."""
    import parallel_streams as streams

    return streams.markdown(_json("verify_throughput.json"))


def _g(x: float) -> str:
    """2 significant figures, small values as 1.1e-4 (the page's style)."""
    if x == 0 or x >= 0.01:
        return f"{x:.2g}"
    mantissa, _, exponent = f"{x:.1e}".partition("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}"


def decode_tolerance() -> str:
    """Decode-time KV against a prefill, per fixture, beside the rule the code declares
    (benchmarks/decode_tolerance.py; the rule: ``tolerances.DECODE_ATOL``)."""
    from pytest_prefixcache.adapters.tolerances import DECODE_ATOL

    lines = [
        "| library | fixture (model type) | trials | worst decode vs prefill | argmax changed "
        "| rule (atol) | smallest output-off-by-one bug |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in _json("decode_tolerance.json")["rows"]:
        rule = DECODE_ATOL.get((r["library"], r["model_type"]))
        lines.append(
            f"| {r['library']} | {r['fixture']} (`{r['model_type']}`) | {r['trials']} "
            f"| {_g(r['worst_decode_vs_prefill'])} | {r['argmax_changed']} "
            f"| {'exact' if rule is None else _g(rule)} "
            f"| {_g(r['smallest_output_off_by_one'])} |"
        )
    return "\n".join(lines)


def audit_cost() -> str:
    """The baseline audit's cost on the default engine (verify_throughput.py --audit-cost)."""
    d = _json("audit_cost.json")
    audited = sorted(d["audited_wall_s"])[len(d["audited_wall_s"]) // 2]
    plain = sorted(d["unaudited_wall_s"])[len(d["unaudited_wall_s"]) // 2]
    return "\n".join(
        [
            f"| run (seed {d['seed']}, {d['requests']:,} requests) | audited requests "
            "| wall time |",
            "| --- | --- | --- |",
            f"| default: audited | {d['audited_requests']:,} | {audited:.1f} s |",
            f"| engine given as an instance: not audited | 0 | {plain:.1f} s |",
        ]
    )


RENDERERS: dict[str, Callable[[], str]] = {
    "audit_cost": audit_cost,
    "decode_tolerance": decode_tolerance,
    "parallel_streams": parallel_streams,
    "verify_cost": verify_cost,
    "families": families,
    "families_hybrid": families_hybrid,
    "families_windows": families_windows,
    "families_targets": families_targets,
    "families_speed": families_speed,
    "failing_runs": failing_runs,
    "prefill": prefill,
    "side_by_side": side_by_side,
    "no_reuse": no_reuse,
}


class PageError(ValueError):
    """A block the page names that no renderer has, or a renderer with no block."""


def page(text: str) -> str:
    """``text`` with every generated block rendered again from the JSON."""
    seen = [m.group(2) for m in BLOCK.finditer(text)]
    unknown = sorted(set(seen) - set(RENDERERS))
    missing = sorted(set(RENDERERS) - set(seen))
    if unknown or missing or len(seen) != len(set(seen)):
        raise PageError(
            f"docs/benchmarks.md: blocks without a renderer {unknown}, renderers without a "
            f"block {missing}, or a block twice ({seen})"
        )
    return BLOCK.sub(lambda m: m.group(1) + RENDERERS[m.group(2)]() + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    try:
        new = page(text)
    except (PageError, OSError, KeyError, ValueError) as exc:
        print(f"benchmarks_page: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(
                "docs/benchmarks.md is stale: run python benchmarks/benchmarks_page.py",
                file=sys.stderr,
            )
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
