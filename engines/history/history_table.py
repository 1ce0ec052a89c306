"""docs/public-record.md, generated from the catalogue and results/: never written by hand.

``render`` makes the page: the table of every catalogued bug (run or not) and, for the rows
that ran, the buggy version's verdict and check, the fixed version's verdict and the seconds to
the first failure; then the counts and the median seconds over the caught rows. A row is
*caught* when the buggy version fails on the expected check and the fixed version passes;
*missed* when the buggy version passes; *false alarm* when the fixed version fails.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from history_catalogue import OURS, Bug
from history_runner import UNCHECKABLE

DOC = Path(__file__).resolve().parents[2] / "docs" / "public-record.md"
COMMAND = "engines/history/run.sh table"
HEADER = (
    "| bug | engine | version with the bug | verdict | check | version with the fix | verdict "
    "| seconds (examples) to first failure | outcome |"
)


def load_results(results: Path) -> dict[str, dict[str, Any]]:
    """results/NAME.json by NAME."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}


def passes(side: dict[str, Any]) -> bool:
    """PASS, or PARTIAL whose only gaps (its ``not_checked``) are what a layered run cannot
    check (history_runner.UNCHECKABLE: results written before parse() read them so)."""
    if side["verdict"].startswith("PASS"):
        return True
    gaps = set(side.get("not_checked") or ())
    return side["verdict"] == "PARTIAL" and bool(gaps) and gaps <= set(UNCHECKABLE)


def outcome(bug: Bug, result: dict[str, Any] | None) -> str:
    """caught, caught (other check), missed, false alarm, error or not run."""
    if result is None:
        return "not run" + (f": {bug.why}" if bug.why else "")
    buggy, fixed = result["buggy"], result["fixed"]
    if "ERROR" in (buggy["verdict"], fixed["verdict"]):
        return "error: the run did not finish (see results/)"
    if buggy["verdict"].startswith("INCONCLUSIVE"):
        return "inconclusive: the buggy version's run neither failed nor passed (see the notes)"
    if not buggy["verdict"].startswith("FAIL"):
        return "missed"
    if fixed["verdict"].startswith("FAIL"):
        if bug.fixed_fails:
            return f"the fixed version fails ({fixed.get('check')}): {bug.fixed_fails}"
        return f"false alarm? the fixed version fails ({fixed.get('check')})"
    if not passes(fixed):  # INCONCLUSIVE: no clean fixed side
        return f"the fixed version is {fixed['verdict'].lower()}" + (
            f": {bug.fixed_fails}" if bug.fixed_fails else ""
        )
    if fixed.get("cache_hits") == 0:  # nothing reused: the fix was never exercised
        return "the fixed version's pass is vacuous: it reused nothing (0 cache hits)" + (
            f": {bug.fixed_fails}" if bug.fixed_fails else ""
        )
    if buggy.get("check") != bug.check:
        return f"caught by another check (expected {bug.check})"
    if bug.replays.startswith("0 of"):
        return f"caught once, unconfirmed: its saved stream failed {bug.replays} replays"
    return "caught"


def _cell(text: Any) -> str:
    return str(text if text not in (None, "") else "-").replace("|", "\\|").replace("\n", " ")


def row(bug: Bug, result: dict[str, Any] | None) -> str:
    reach = [bug.model] if bug.model not in ("none", "hf", "gguf") else []
    reach += [f"`{bug.flags}`"] if bug.flags else []
    if bug.concurrency > 1:
        reach.append(f"waves of {bug.concurrency}")
    if not bug.tap:
        reach.append("no tap")
    if bug.corpus:  # the request shape the run adds (engines/history/corpus/)
        reach.append(f"scenario {bug.corpus.removesuffix('.json')}")
    where = f"{bug.engine}" + (f" ({', '.join(reach)})" if reach else "")
    title = f"{bug.reference}: {bug.description} (class {bug.bug_class})"
    if result is None:
        cells = [title, where, bug.buggy, "-", f"({bug.check})", bug.fixed, "-", "-"]
    else:
        b, f = result["buggy"], result["fixed"]
        seconds: Any = b.get("seconds_to_failure")
        if seconds is None and b["verdict"].startswith("FAIL"):
            seconds = f"<= {b.get('seconds')} (the run's wall time)"  # a timeout: no progress
        elif b.get("examples_to_failure") is not None:
            seconds = f"{seconds} ({b['examples_to_failure']})"
        cells = [title, where, b["version"], b["verdict"], b.get("check"), f["version"]]
        cells += [f["verdict"], seconds]
    return "| " + " | ".join(_cell(c) for c in [*cells, outcome(bug, result)]) + " |"


def summary(bugs: Sequence[Bug], results: dict[str, dict[str, Any]]) -> list[str]:
    ran = [b for b in bugs if b.name in results]
    kinds = [outcome(b, results[b.name]) for b in ran]
    caught = [
        results[b.name]["buggy"].get("seconds_to_failure")
        for b, k in zip(ran, kinds)
        if k == "caught" or k.startswith("caught once")
    ]
    times = [s for s in caught if s is not None]
    median = f"{statistics.median(times):g} s" if times else "n/a"
    caught_rows = [b for b, k in zip(ran, kinds) if k == "caught" or k.startswith("caught once")]
    bounded = [  # a timeout counted at its run's wall time, an upper bound
        results[b.name]["buggy"].get("seconds_to_failure")
        if results[b.name]["buggy"].get("seconds_to_failure") is not None
        else results[b.name]["buggy"].get("seconds")
        for b in caught_rows
    ]
    bounded = [x for x in bounded if x is not None]
    median_bounded = f"{statistics.median(bounded):g} s" if bounded else "n/a"
    examples = [
        results[b.name]["buggy"].get("examples_to_failure")
        for b, k in zip(ran, kinds)
        if k == "caught" or k.startswith("caught once")
    ]
    counted = [e for e in examples if e is not None]
    median_examples = f"{statistics.median(counted):g}" if counted else "n/a"
    public = [b for b in bugs if b.engine != OURS]
    engines = sorted({b.engine for b in public})
    return [
        f"- catalogued: {len({b.reference for b in public})} public bugs across {len(engines)} "
        f"engines ({', '.join(engines)}) in {len(public)} entries (a bug run in several "
        f"configurations has one each), {sum(b.installable for b in public)} entries with both "
        f"versions seen installable; and {len(bugs) - len(public)} regression rows of this "
        "repository",
        f"- run: {len(ran)}; caught by the expected check with the fix passing: "
        f"{len(caught)}, of which {len(caught) - kinds.count('caught')} unconfirmed (the saved "
        f"stream did not fail again alone); missed: {kinds.count('missed')}; other: "
        f"{len(ran) - len(caught) - kinds.count('missed')}; distinct public bugs caught in at "
        f"least one configuration: {len({b.reference for b in caught_rows if b.engine != OURS})}",
        f"- median seconds to the first failure over the caught rows: {median} (over "
        f"{len(times)} of {len(caught)}: a timeout ends its test before any progress line "
        "counts it, so only the run's wall time bounds it); median examples (generated "
        f"streams, corpus scenarios included) run by then: {median_examples} (over "
        f"{len(counted)} of {len(caught)}); counting each timeout at its run's wall time (an "
        f"upper bound): {median_bounded} over {len(bounded)}",
    ]


def render(bugs: Sequence[Bug], results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "# The public record: real prefix-cache bugs, run on the version that had them",
        "",
        f"Generated by `{COMMAND}` from engines/history/bugs.toml and "
        "engines/history/results/ (never edit by hand; a test fails when it is stale).",
        "Each run: the stock verifier with the engine's preset on the version with the bug, then",
        "on the version with the fix (`engines/history/run.sh NAME`), seed 1, a bounded example",
        "budget, stopping at the first failing test; the command of every run is in its",
        "results file (run from the checkout's root with `PYTHONPATH=.`, as run.sh does).",
        "Seconds to the first failure: the plugin's first progress line (one a second) that",
        "counts a failing example, from the session's start (servers included), installs",
        "excluded; on a shared 2-core machine at a load average of 6-11. In brackets: the",
        "examples (streams, corpus scenarios included) that line counts.",
        "",
        *summary(bugs, results),
        "",
        HEADER,
        "|" + "---|" * 9,
        *(row(b, results.get(b.name)) for b in bugs),
        "",
        "## Notes on the runs",
        "",
        *(f"- {b.name}: {b.note}" for b in bugs if b.note),
        "",
        "Every entry's source (what was read to find it) and the reason an entry is not run are",
        "in engines/history/bugs.toml; the shrunk counterexamples the notes cite are in",
        "engines/history/counterexamples/ (replay one with `--prefixcache-replay=FILE`).",
        "",
    ]
    return "\n".join(lines)
