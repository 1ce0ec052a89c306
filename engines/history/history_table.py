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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from history_catalogue import OURS, Bug
from history_runner import TIMEOUTS, UNCHECKABLE

from pytest_prefixcache.verify.worker import DEFAULT_TIMEOUT

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


def reach(bug: Bug) -> list[str]:
    """How an entry's run reaches its bug: the fixture, the server flags, the waves, no tap,
    the corpus scenario it adds (engines/history/corpus/)."""
    out = [bug.model] if bug.model not in ("none", "hf", "gguf") else []
    out += [f"`{bug.flags}`"] if bug.flags else []
    if bug.concurrency > 1:
        out.append(f"waves of {bug.concurrency}")
    if not bug.tap:
        out.append("no tap")
    if bug.corpus:
        out.append(f"scenario {bug.corpus.removesuffix('.json')}")
    return out


def capability(miss: Bug, catch: Bug) -> str:
    """What ``catch``'s run adds to ``miss``'s: its :func:`reach` beyond the miss's."""
    added = [x for x in reach(catch) if x not in reach(miss)]
    return ", ".join(added) or "the same configuration"


def missed(bug: Bug, catalogue: Mapping[str, Bug]) -> str:
    """A miss's outcome: the entry its ``turned_into`` names and the capability that entry
    adds, or why the suite cannot reach it (``why``)."""
    into = catalogue.get(bug.turned_into)
    if into is not None:
        return f"missed; turned into {into.name} by a new capability: {capability(bug, into)}"
    return "missed" + (f": {bug.why}" if bug.why else "")


def outcome(
    bug: Bug, result: dict[str, Any] | None, catalogue: Mapping[str, Bug] | None = None
) -> str:
    """caught, caught (other check), missed (and what it was turned into, or why), false
    alarm, error or not run; ``catalogue``: the entries by name (a miss's ``turned_into``)."""
    if result is None:
        return "not run" + (f": {bug.why}" if bug.why else "")
    buggy, fixed = result["buggy"], result["fixed"]
    if "ERROR" in (buggy["verdict"], fixed["verdict"]):
        return "error: the run did not finish (see results/)"
    if buggy["verdict"].startswith("INCONCLUSIVE"):
        return "inconclusive: the buggy version's run neither failed nor passed (see the notes)"
    if not buggy["verdict"].startswith("FAIL"):
        return missed(bug, catalogue or {})
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


def row(bug: Bug, result: dict[str, Any] | None, catalogue: Mapping[str, Bug] | None = None) -> str:
    where = f"{bug.engine}" + (f" ({', '.join(reach(bug))})" if reach(bug) else "")
    title = f"{bug.reference}: {bug.description} (class {bug.bug_class})"
    if result is None:
        cells = [title, where, bug.buggy, "-", f"({bug.check})", bug.fixed, "-", "-"]
    else:
        b, f = result["buggy"], result["fixed"]
        seconds: Any = b.get("seconds_to_failure")
        if seconds is None and b["verdict"].startswith("FAIL"):
            seconds = f"<= {b.get('seconds')} (the run's wall time)"  # a result from before
        elif b.get("examples_to_failure") is not None:  # the plugin stamped its first failure
            load = f"; load {b['load']:g}" if b.get("load") is not None else ""
            seconds = f"{seconds:g} ({b['examples_to_failure']}{load})"
        cells = [title, where, b["version"], b["verdict"], b.get("check"), f["version"]]
        cells += [f["verdict"], seconds]
    return "| " + " | ".join(_cell(c) for c in [*cells, outcome(bug, result, catalogue)]) + " |"


def _caught(kind: str) -> bool:
    return kind == "caught" or kind.startswith("caught once")


def misses(bugs: Sequence[Bug], results: dict[str, dict[str, Any]]) -> str:
    """The misses, counted from the results: how many were turned into a caught entry by a
    new capability (``turned_into``, named with what it adds) and which are still missed."""
    by_name = {b.name: b for b in bugs}
    ran = [b for b in bugs if b.name in results]
    missed_rows = [b for b in ran if outcome(b, results[b.name]).startswith("missed")]
    turned = [
        (b, by_name[b.turned_into])
        for b in missed_rows
        if b.turned_into in results
        and _caught(outcome(by_name[b.turned_into], results[b.turned_into]))
    ]
    names = "; ".join(f"{b.name} by {c.name} ({capability(b, c)})" for b, c in turned)
    rest = [b.name for b in missed_rows if b not in {t for t, _ in turned}]
    return (
        f"- misses: {len(missed_rows)}, of which {len(turned)} turned into catches by a new "
        f"capability" + (f": {names}" if names else "") + "; still missed, each with its "
        f"reason in its row: {', '.join(rest) or 'none'}"
    )


def slowest(bugs: Sequence[Bug], results: dict[str, dict[str, Any]]) -> str:
    """The slowest answer of a version with the fix, by runner (report.json's slowest_call,
    over the results that record it): what each runner's --prefixcache-timeout must exceed."""
    worst: dict[str, tuple[float, str]] = {}
    for b in bugs:
        call = (results.get(b.name) or {}).get("fixed", {}).get("slowest_call")
        if call is not None and call > worst.get(b.runner, (-1.0, ""))[0]:
            worst[b.runner] = (call, b.name)
    shown = "; ".join(
        f"{runner} {call:.2f} s ({name}, timeout {TIMEOUTS.get(runner, DEFAULT_TIMEOUT):g} s)"
        for runner, (call, name) in sorted(worst.items())
    )
    return (
        "- slowest answer of a version with the fix (report.json's slowest_call, a wave's from "
        f"its last arrival; the results that record it), by runner: {shown or 'none recorded'}"
    )


def summary(bugs: Sequence[Bug], results: dict[str, dict[str, Any]]) -> list[str]:
    ran = [b for b in bugs if b.name in results]
    kinds = [outcome(b, results[b.name]) for b in ran]
    caught_rows = [b for b, k in zip(ran, kinds) if _caught(k)]
    sides = [results[b.name]["buggy"] for b in caught_rows]
    times = [x["seconds_to_failure"] for x in sides if x.get("seconds_to_failure") is not None]
    median = f"{statistics.median(times):g} s" if times else "n/a"
    bounded = [  # a result without a stamp counted at its run's wall time, an upper bound
        x["seconds_to_failure"] if x.get("seconds_to_failure") is not None else x.get("seconds")
        for x in sides
    ]
    bounded = [x for x in bounded if x is not None]
    median_bounded = f"{statistics.median(bounded):g} s" if bounded else "n/a"
    counted = [x["examples_to_failure"] for x in sides if x.get("examples_to_failure") is not None]
    median_examples = f"{statistics.median(counted):g}" if counted else "n/a"
    n_missed = sum(k.startswith("missed") for k in kinds)
    public = [b for b in bugs if b.engine != OURS]
    engines = sorted({b.engine for b in public})
    unmeasured = (
        f"over {len(times)} of {len(sides)}: the other {len(sides) - len(times)} ran before the "
        "plugin stamped its first failure, and a timeout or a last scenario ended their test "
        "before a progress line counted it; counting those at their run's wall time (an upper "
        f"bound): {median_bounded} over {len(bounded)}"
        if len(times) < len(sides)
        else f"measured on every one of the {len(sides)}"
    )
    by_stamp = sum(x.get("timed_by") == "stamp" for x in sides)
    if by_stamp:
        unmeasured += (
            f"; {by_stamp} by the plugin's stamp, {len(times) - by_stamp} by an older run's first "
            "failing progress line"
        )
    return [
        f"- catalogued: {len({b.reference for b in public})} public bugs across {len(engines)} "
        f"engines ({', '.join(engines)}) in {len(public)} entries (a bug run in several "
        f"configurations has one each), {sum(b.installable for b in public)} entries with both "
        f"versions seen installable; and {len(bugs) - len(public)} regression rows of this "
        "repository",
        f"- run: {len(ran)}; caught by the expected check with the fix passing: "
        f"{len(caught_rows)}, of which {len(caught_rows) - kinds.count('caught')} unconfirmed "
        f"(the saved stream did not fail again alone); missed: {n_missed}; other: "
        f"{len(ran) - len(caught_rows) - n_missed}; distinct public bugs caught in at "
        f"least one configuration: {len({b.reference for b in caught_rows if b.engine != OURS})}",
        misses(bugs, results),
        slowest(bugs, results),
        f"- median seconds to the first failure over the caught rows: {median} ({unmeasured}); "
        "median examples (generated streams, corpus scenarios included) run by then: "
        f"{median_examples} (over {len(counted)} of {len(sides)})",
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
        "Seconds to the first failure: the moment the plugin stamped its first failure of any",
        "kind (report.json's first_failure: a check's problem, a timeout as it fired, a test's",
        "error), from the session's start (servers included), installs excluded; a result",
        "from before that stamp: the first progress line (one a second) that counts a failing",
        "example. On a shared 2-core machine at a load average of 2.5-11. In brackets: the",
        "examples (streams, corpus scenarios included) run by then and, where recorded, the",
        "5-minute load average as the run ended.",
        "",
        *summary(bugs, results),
        "",
        HEADER,
        "|" + "---|" * 9,
        *(row(b, results.get(b.name), {x.name: x for x in bugs}) for b in bugs),
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
