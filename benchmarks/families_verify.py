"""The default verification on every model family, as a user runs it.

    python benchmarks/families_verify.py [--models tiny-qwen2-vl,tiny-gemma3,...] [--seed 1]
        [--out benchmarks/results/families] [--examples N] [--workers N]
    python benchmarks/families_verify.py --markdown benchmarks/results/families/families.json

For each model, one after the other: ``prefixcache verify --model NAME --seed S --out
OUT/NAME`` (the default engine, example count and properties: streams, waves, closed loop, the
baseline audit), with ``benchmarks/verify_counts.py`` loaded to count the waves and the streams
that sent the engine's replies back. The wall time is the whole ``prefixcache`` process, its CPU
time the process's user + system time. Each run's row (verdict, requests, streams, waves,
closed-loop share, audited / all, reuse against each reference, worst difference, wall and CPU
time, load average, the exact command) is added to ``OUT/families.json`` as it finishes, so a
long run can be read while it goes on; the reports stay in ``OUT/NAME/`` (``report.json``,
``junit.xml``, ``report.html``; the reports, ~250 KB each, are git-ignored: the row holds
what the docs quote). ``--markdown`` prints the table for the docs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("tiny-qwen2-vl", "tiny-llama", "tiny-qwen3.5-vl", "tiny-qwen3.5", "tiny-gemma3",
          "tiny-gemma3-text")  # fmt: skip


def command(
    model: str,
    seed: int,
    out: Path,
    examples: int | None,
    workers: str | None = None,
    database: str | None = None,
) -> list[str]:
    """The user's command for ``model`` (the counting plugin goes after it, past ``--``)."""
    cmd = ["prefixcache", "verify", "--model", model, "--seed", str(seed), "--out", str(out)]
    if database is not None:  # "none": every model draws the same streams from the seed
        cmd += ["--database", database]
    if examples is not None:
        cmd += ["--examples", str(examples)]
    if workers is not None:
        cmd += ["--workers", workers]
    return cmd


def _row(report_path: Path, counts: dict[str, int]) -> dict[str, Any]:
    from pytest_prefixcache.output.report import Report
    from pytest_prefixcache.output.summary import summarize

    r = Report.read_json(report_path)
    cov = r.coverage
    audit = cov.get("cold baseline", {})
    closed = cov.get("closed loop", {})
    runs, closed_streams = counts.get("stream_runs", 0), counts.get("closed_loop_streams", 0)
    return {
        "verdict": r.verdict,
        "engine_error": r.engine_error,
        "requests": r.requests,
        "cache_hits": r.cache_hits,
        "streams": r.streams,
        "stream_runs": runs,
        "closed_loop_streams": closed_streams,
        "closed_loop_share": round(closed_streams / runs, 3) if runs else None,
        "closed_loop_requests": closed.get("applied", 0),
        "waves": counts.get("waves", 0),
        "wave_requests": counts.get("wave_requests", 0),
        "audited": audit.get("applied", 0),
        "audit_of": sum(audit.values()),
        "reference": r.reference,
        "reuse": {k: list(v) for k, v in r.reuse_totals().items()},
        "efficiency": r.efficiency,
        "worst_diff": r.worst_diff,
        "worst_diff_where": r.worst_diff_where,
        "failures": [f.check for f in r.failures],
        "summary": summarize(r).lines(),
    }


def _children_cpu() -> float:
    """User + system CPU seconds of this process's finished children (a shared machine's
    wall time depends on its load; the CPU time much less)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run(
    model: str,
    seed: int,
    out: Path,
    examples: int | None,
    workers: str | None = None,
    database: str | None = None,
) -> dict[str, Any]:
    here = out / model
    counts = here / "counts.json"
    here.mkdir(parents=True, exist_ok=True)
    for stale in here.glob("counts.json*"):
        stale.unlink()
    cmd = command(model, seed, here, examples, workers, database)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PREFIXCACHE_VERIFY_COUNTS": str(counts)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "benchmarks"), env.get("PYTHONPATH", "")])
    exe = [str(Path(sys.executable).with_name("prefixcache")), *cmd[1:]]
    exe += ["--", "-p", "verify_counts"]
    load = os.getloadavg()[0]
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.run(exe, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    cpu = _children_cpu() - cpu0
    (here / "output.txt").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    row: dict[str, Any] = {"model": model, "exit": proc.returncode, "wall_s": round(wall, 1)}
    row["cpu_s"] = round(cpu, 1)
    row["load_before"], row["load_after"] = round(load, 2), round(os.getloadavg()[0], 2)
    shown = command(model, seed, Path(os.path.relpath(here, ROOT)), examples, workers, database)
    row["command"] = "HF_HUB_OFFLINE=1 .venv/bin/" + shlex.join(shown)
    if (here / "report.json").exists():
        cnt: dict[str, int] = {}
        for f in sorted(here.glob("counts.json.*")):  # one per process (xdist workers)
            for k, v in json.loads(f.read_text()).items():
                cnt[k] = cnt.get(k, 0) + v
        row.update(_row(here / "report.json", cnt))
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| model | verdict | requests (streams) | waves (requests in them) | streams sending the "
        "engine's replies back | audited / all | reuse vs token oracle | vs snapshot reference "
        "| worst diff | wall (CPU) | load |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    lines = [head]
    for r in rows:
        if "verdict" not in r:
            lines.append(f"| `{r['model']}` | exit {r['exit']} (no report) | | | | | | | | | |")
            continue
        cpu = f" ({r['cpu_s']:.0f} s)" if "cpu_s" in r else ""
        pct = {k: f"{a / b:.1%} ({a:,} of {b:,})" for k, (a, b) in r["reuse"].items() if b}

        lines.append(
            f"| `{r['model']}` | {r['verdict'].upper()} | {r['requests']:,} ({r['streams']}) "
            f"| {r['waves']} ({r['wave_requests']}) | {r['closed_loop_streams']} of "
            f"{r['stream_runs']} | {r['audited']} / {r['audit_of']} | {pct.get('token', '-')} "
            f"| {pct.get('snapshot', '-')} | {r['worst_diff']:.3g} | {r['wall_s']:.0f} s{cpu} "
            f"| {r['load_before']:g}-{r['load_after']:g} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--examples", type=int)
    p.add_argument("--workers", metavar="N|auto", help="prefixcache verify --workers")
    p.add_argument("--database", metavar="DIR|URL|none", help="prefixcache verify --database")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/families")
    p.add_argument("--markdown", type=Path, metavar="JSON")
    a = p.parse_args(argv)
    if a.markdown:
        print(markdown(json.loads(a.markdown.read_text())))
        return 0
    table = a.out / "families.json"
    rows = json.loads(table.read_text()) if table.exists() else []
    for model in a.models.split(","):
        row = run(model, a.seed, a.out.resolve(), a.examples, a.workers, a.database)
        rows = [r for r in rows if r["model"] != model] + [row]
        table.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
        print(f"{model}: exit {row['exit']}, {row.get('verdict', 'no report')}, "
              f"{row['wall_s']} s", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
