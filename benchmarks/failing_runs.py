"""What a failing run costs against a passing one: the default run (the README's Quickstart
command, ``--prefixcache-seed=1``) on the default engine and on mutants of the bug zoo, each
with the default shrink budget and with ``--prefixcache-shrink-budget=none`` (Hypothesis's own
limits: the run before the budget), run back to back in one session.

    python benchmarks/failing_runs.py --json benchmarks/results/failing_runs.json
    python benchmarks/failing_runs.py --only placeholder_collision never_stores --json out.json
    python benchmarks/failing_runs.py --markdown benchmarks/results/failing_runs.json

Per run: wall and CPU seconds, requests, examples run after a property's first failure
(``shrink_examples``) and skipped past the budget (``shrink_skipped``), each failing test with
its check and the length of its saved (shrunk) stream, each test's duration (pytest's
``--durations``), the load average before and after.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite_run import suite_run

ROOT = Path(__file__).resolve().parents[1]
SUITE = ["-m", "pytest", "-p", "no:cacheprovider", "--prefixcache-verify", "--pyargs",
         "pytest_prefixcache.suite", "--prefixcache-seed=1", "--prefixcache-database=none",
         "--durations=0"]  # fmt: skip
#: Mutants of the default fixture (tiny-qwen2-vl) whose default run fails without timing.
MUTANTS = (
    "placeholder_collision", "partial_image_merge", "image_order_ignored", "unchained_blocks",
    "output_kv_off_by_one", "namespace_missing", "mrope_restart", "never_stores",
)  # fmt: skip
BUDGETS = ("default", "none")


def run(name: str, budget: str) -> dict[str, Any]:
    """The default run of ``name`` (``pass``: the default engine) with ``budget``."""
    args = [] if name == "pass" else [f"--prefixcache-engine=reference_engine.mutants:{name}"]
    if budget != "default":
        args.append(f"--prefixcache-shrink-budget={budget}")
    with suite_run(f"failing-{name}", [*SUITE, *args]) as done:
        proc, rep = done.proc, done.report
        durations = {
            m.group(2).split("::")[-1]: float(m.group(1))
            for m in re.finditer(r"([\d.]+)s call\s+(\S+)", proc.stdout)
        }
        failures = []
        for f in rep.get("failures", []):
            stream = Path(f["stream_dir"] or "") / "stream.json"
            n = len(json.loads(stream.read_text())["requests"]) if f["stream_dir"] else None
            failures.append({"test": f["test"].split("::")[-1], "check": f["check"],
                             "stream_requests": n, "replay": bool(f.get("replay"))})  # fmt: skip
        return {
            "name": name,
            "budget": budget,
            "exit": proc.returncode,
            "verdict": rep.get("verdict"),
            "wall_s": done.wall_s,
            "cpu_s": done.cpu_s,
            "requests": rep.get("requests"),
            "streams": rep.get("streams"),
            "shrink_examples": rep.get("shrink_examples"),
            "shrink_skipped": rep.get("shrink_skipped"),
            "failures": failures,
            "durations": durations,
            "load_before": done.load_before,
            "load_after": done.load_after,
        }


def markdown(rows: list[dict[str, Any]]) -> str:
    """One line per run: its cost against the passing run with the same budget."""
    base = {r["budget"]: r for r in rows if r["name"] == "pass"}
    out = [
        "| engine | shrink budget | verdict (failing tests) | wall | CPU | CPU / passing run "
        "| requests | examples after a failure (skipped) | shrunk stream lengths |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ref = base.get(r["budget"]) or base.get("default")
        ratio = f"{r['cpu_s'] / ref['cpu_s']:.2f}" if ref else "-"
        lengths = ", ".join(str(f["stream_requests"]) for f in r["failures"]) or "-"
        out.append(
            f"| {r['name']} | {r['budget']} | {r['verdict']} ({len(r['failures'])}) "
            f"| {r['wall_s']:.1f} s | {r['cpu_s']:.1f} s | {ratio} | {r['requests']:,} "
            f"| {r['shrink_examples']} ({r['shrink_skipped']}) | {lengths} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", metavar="MUTANT", help="these mutants (default: all)")
    p.add_argument("--budgets", nargs="+", default=list(BUDGETS), help="default and/or none")
    p.add_argument("--json", type=Path, help="write the runs here")
    p.add_argument("--markdown", type=Path, metavar="JSON", help="print the table of a JSON")
    a = p.parse_args(argv)
    if a.markdown:
        try:
            runs = json.loads(a.markdown.read_text())["runs"]
        except OSError as exc:
            p.error(f"--markdown {str(a.markdown)!r}: cannot read it ({exc.strerror})")
        except (ValueError, KeyError, TypeError):
            p.error(f"--markdown {str(a.markdown)!r}: not the JSON this script writes (no runs)")
        print(markdown(runs))
        return 0
    rows: list[dict[str, Any]] = []
    for name in ["pass", *(a.only or MUTANTS)]:
        for budget in a.budgets:  # back to back: the pair sees the same load
            rows.append(run(name, budget))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "failures"}), flush=True)
            if a.json:
                data = {"date": datetime.date.today().isoformat(), "runs": rows}
                a.json.write_text(json.dumps(data, indent=1) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
