"""The README's durations and counts, measured by running what the README shows.

    python benchmarks/readme_figures.py                # run them, write the JSON, the README
    python benchmarks/readme_figures.py --only mutant  # one of them
    python benchmarks/readme_figures.py --render       # the README from the JSON, nothing run

Each figure is a command of the README, run here as a new user runs it (a subprocess of this
interpreter, ``HF_HUB_OFFLINE=1``, a temp directory of its own, removed afterwards), with its
JSON report read back:

- ``quickstart``: the Quickstart's first command (the default engine, default examples);
- ``mutant``: "What a caught bug looks like" (``placeholder_collision``, ``--prefixcache-seed=1``);
- ``server``: the worked mlx_lm.server example (tiny-llama, 5 examples, seed 1).

Writes ``benchmarks/results/readme_figures.json`` (wall and CPU seconds, requests, streams,
hits, audited requests, failures, the load average before and after, the date) and rewrites
the README's spans marked ``<!-- figure:NAME -->...<!-- /figure -->`` from it.
tests/test_readme_figures.py fails when a span differs from what the JSON renders.
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
RESULTS = ROOT / "benchmarks" / "results" / "readme_figures.json"
README = ROOT / "README.md"
SPAN = re.compile(r"<!-- figure:(\w+) -->(.*?)<!-- /figure -->", re.S)
SUITE = ["-m", "pytest", "-p", "no:cacheprovider", "--prefixcache-verify", "--pyargs",
         "pytest_prefixcache.suite"]  # fmt: skip


def _server_args() -> list[str]:
    from pytest_prefixcache.package_data import FIXTURES

    model = FIXTURES / "tiny-llama"
    server = (
        "{python} -m pytest_prefixcache.tap mlx_lm.server:main "
        f"--model {model} --host 127.0.0.1 --port {{port}}"
    )
    return [
        "--prefixcache-examples=5",
        "--prefixcache-seed=1",
        f"--prefixcache-server-cmd={server}",
    ]


def _server_env() -> dict[str, str]:
    from pytest_prefixcache.package_data import FIXTURES

    model = FIXTURES / "tiny-llama"
    server = (
        "{python} -m pytest_prefixcache.tap mlx_lm.server:main "
        f"--model {model} --host 127.0.0.1 --port {{port}}"
    )
    return {
        "PREFIXCACHE_TAP_SERVER": "1", "PREFIXCACHE_TEXT_ONLY": "1",
        "PREFIXCACHE_RENDER": f"text:{model}", "PREFIXCACHE_CHECK_LABELS": "0",
        "PREFIXCACHE_COLD": "server", "PREFIXCACHE_COLD_CMD": f"{server} --prompt-cache-size 0",
        "PREFIXCACHE_CLAIMS": '[{"api": "usage.prompt_tokens_details.cached_tokens"}]',
    }  # fmt: skip


RUNS: dict[str, tuple[list[str], Any]] = {
    "quickstart": ([], dict),
    "mutant": (
        [
            "--prefixcache-engine=reference_engine.mutants:placeholder_collision",
            "--prefixcache-seed=1",
        ],
        dict,
    ),
    "server": ([], _server_env),
}


def run(name: str) -> dict[str, Any]:
    """Run figure ``name`` and return what it measured."""
    args, env_of = RUNS[name]
    if name == "server":
        args = _server_args()
    argv = [*SUITE, *args, "--prefixcache-database=none"]
    with suite_run(f"readme-{name}", argv, env_of()) as done:
        proc, rep = done.proc, done.report
    tail = [ln for ln in proc.stdout.splitlines() if re.match(r"=+ .*(passed|failed)", ln)]
    from pytest_prefixcache.package_data import FIXTURES

    out = proc.stdout.replace(str(FIXTURES), ".../fixtures")
    return {
        "command": " ".join(["pytest", *SUITE[4:], *args]),
        "exit": proc.returncode,
        "verdict": rep.get("verdict"),
        "wall_s": done.wall_s,
        "cpu_s": done.cpu_s,
        "requests": rep.get("requests"),
        "streams": rep.get("streams"),
        "cache_hits": rep.get("cache_hits"),
        "audited": (rep.get("coverage", {}).get("cold baseline", {}) or {}).get("applied"),
        "failures": len(rep.get("failures", [])),
        "failures_by_check": rep.get("failures_by_check", {}),
        "pytest_line": tail[-1].strip("= ") if tail else "",
        "transcript": _transcript(out) if name == "server" else "",
        "load_before": done.load_before,
        "load_after": done.load_after,
        "date": datetime.date.today().isoformat(),
    }


def _transcript(out: str) -> str:
    """The README's shape of a run's output: the header, the collection, the progress line
    and the plugin's summary, each line as printed."""
    lines = out.splitlines()
    keep = [ln for ln in lines if ln.startswith(("prefixcache: engine", "collected "))]
    keep += [ln for ln in lines if "verification.py " in ln and "%]" in ln][:1]
    start = next(i for i, ln in enumerate(lines) if re.match(r"=+ prefixcache =+", ln))
    end = next(i for i, ln in enumerate(lines) if i > start and ln.startswith("verdict:"))
    tail = [ln for ln in lines if re.match(r"=+ .*(passed|failed)", ln)][-1:]
    summary: list[str] = []
    for ln in lines[start : end + 1]:  # trimmed: the detail lines under a heading, once "..."
        detail = ln.startswith("  ") and not ln.startswith("  " * 1 + " ") and ":" in ln
        if detail and not re.match(r"  [a-z][a-z ]+ +\d+/\d+", ln):
            if summary[-1] != "  ...":
                summary.append("  ...")
            continue
        if not ln.startswith("reproduce with"):
            summary.append(ln)
    return "\n".join([*keep, *summary, *tail])


def _n(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) else str(x)


def render(name: str, f: dict[str, Any]) -> str:
    """The README's sentence for figure ``name``."""
    low, high = sorted((f["load_before"], f["load_after"]))
    load = f"load {low:g}-{high:g}"
    if name == "quickstart":
        return (
            f"{f['wall_s']:.0f} s on 2 cores ({f['cpu_s']:.0f} s CPU, {load}; "
            f"{_n(f['requests'])} requests in {_n(f['streams'])} streams, "
            f"{_n(f['audited'])} audited by a fresh engine)"
        )
    if name == "mutant":
        return (
            f"{f['failures']} failures; {f['wall_s']:.0f} s on 2 cores, {load}, "
            f"{_n(f['requests'])} requests"
        )
    return f"{f['wall_s']:.0f} s on 2 cores, {load}; {_n(f['requests'])} requests"


#: figure -> a line of the README's transcript of it (its code block gets the figure's lines)
BLOCKS = {
    "mutant": "mutants:placeholder_collision --prefixcache-seed=1",
    "server": "5 examples per property, tolerance",
}


def _block(text: str, anchor: str, f: dict[str, Any]) -> str:
    start = text.index(anchor)
    end = text.index("```", start)
    if f.get("transcript"):  # the whole block, as printed
        start = text.rindex("```\n", 0, start) + 4
        return text[:start] + f["transcript"] + "\n" + text[end:]
    block = text[start:end]
    block = re.sub(
        r"requests run: .*",
        f"requests run: {f['requests']} in {f['streams']} stream(s), "
        f"{f['cache_hits']} with cache hits",
        block,
    )
    if f.get("failures_by_check"):
        checks = ", ".join(f"{k}: {v}" for k, v in sorted(f["failures_by_check"].items()))
        block = re.sub(r"failures by check: .*", f"failures by check: {checks}", block)
    line = f" {f['pytest_line']} "
    block = re.sub(r"=+ \d+ (failed|passed).*=+", line.center(82, "="), block)
    return text[:start] + block + text[end:]


def rewrite(text: str, figures: dict[str, dict[str, Any]]) -> str:
    """``text`` with every figure span rendered from ``figures``."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in figures:
            raise SystemExit(f"README: figure {name!r} is not in {RESULTS.name}")
        return f"<!-- figure:{name} -->{render(name, figures[name])}<!-- /figure -->"

    text = SPAN.sub(one, text)
    for name, anchor in BLOCKS.items():  # the transcript's summary lines in its code block
        if name in figures:
            text = _block(text, anchor, figures[name])
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(RUNS), action="append")
    ap.add_argument("--render", action="store_true", help="only rewrite the README from the JSON")
    a = ap.parse_args(argv)
    figures: dict[str, dict[str, Any]] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not a.render:
        for name in a.only or sorted(RUNS):
            figures[name] = run(name)
            print(name, json.dumps(figures[name]), flush=True)
        RESULTS.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    README.write_text(rewrite(README.read_text(encoding="utf-8"), figures), encoding="utf-8")
    print(f"wrote {RESULTS.relative_to(ROOT)} and the README's figure spans")
    return 0


if __name__ == "__main__":
    sys.exit(main())
