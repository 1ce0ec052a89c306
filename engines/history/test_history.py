"""The public record's lab (engines/history): the catalogue's format, the runner's command
building and result parsing, the table and its staleness, with stubs; the installs and runs
only with ``PREFIXCACHE_HISTORY=1`` (``test_an_entry_runs``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from history_catalogue import (  # noqa: E402
    OURS,
    Bug,
    CatalogueError,
    load,
    loads,
    plugin_checks,
)
from history_cli import main  # noqa: E402
from history_runner import (  # noqa: E402
    Run,
    command,
    first_failure,
    first_failure_seconds,
    install,
    matrix_text,
    mlx_for,
    parse,
    stream_size,
)
from history_table import DOC, load_results, outcome, render, row  # noqa: E402

from pytest_prefixcache.session.matrix_file import read_matrix  # noqa: E402
from pytest_prefixcache.session.progress import Progress  # noqa: E402

CHECKS = plugin_checks(ROOT / "pytest_prefixcache")
GOOD = """
[[bug]]
name = "x-1-thing"
engine = "mlx-lm"
reference = "ml-explore/mlx-lm#1"
source = "read in its git log"
description = "a thing went wrong"
class = 10
buggy = "0.31.0"
fixed = "0.31.1"
installable = true
model = "tiny-llama"
flags = ""
concurrency = 8
select = "test_waves"
check = "equivalence"
runner = "mlx-lm"
"""


def stub_bug(**changes: object) -> Bug:
    return replace(loads(CHECKS, GOOD)[0], **changes)  # type: ignore[arg-type]


def test_the_catalogue_is_well_formed_and_large_enough() -> None:
    bugs = load(CHECKS)
    public = [b for b in bugs if b.engine != OURS]
    assert len(public) >= 20, len(public)
    assert len({b.engine for b in public}) >= 4
    assert any(b.engine == OURS for b in bugs)  # the regression rows
    assert sum(b.runs for b in bugs) >= 5


def test_the_plugins_check_names_are_read_from_the_plugin() -> None:
    assert {"equivalence", "fault", "positive control", "reuse bound", "claims"} <= CHECKS
    assert "wrong answer" not in CHECKS


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ('buggy = "0.31.0"\n', "", "no 'buggy'"),
        ('buggy = "0.31.0"', 'buggy = "latest"', "does not look like a version"),
        ('check = "equivalence"', 'check = "wrong answer"', "not a check of the plugin"),
        ("class = 10", "class = 99", "is not a bug class"),
        ("concurrency = 8", 'concurrency = "8"', "is not a int"),
        ('reference = "ml-explore/mlx-lm#1"', 'reference = "#1"', "is not owner/repo#N"),
        ('runner = "mlx-lm"', 'runner = "none"', "needs a 'why'"),
        ('model = "tiny-llama"', 'model = "llama-70b"', "is not one of"),
        ('flags = ""', 'flags = ""\ncolour = "red"', "unknown field 'colour'"),
        ('buggy = "0.31.0"', 'buggy = "0.29.1"', "runs versions from 0.30.0 on"),
    ],
)
def test_a_bad_entry_is_refused_naming_it_and_the_field(old: str, new: str, says: str) -> None:
    assert len(loads(CHECKS, GOOD)) == 1  # the control: the good entry loads
    assert old in GOOD
    with pytest.raises(CatalogueError, match=re.escape(says)) as info:
        loads(CHECKS, GOOD.replace(old, new))
    assert "x-1-thing" in str(info.value)


@pytest.mark.parametrize(
    ("reference", "loads_"),
    [
        ("Blaizzy/mlx-vlm v0.7.1", True),  # a release whose diff is the only record
        ("ml-explore/mlx-lm v0.32.0", True),
        ("ml-explore/mlx-lm 23af8570", True),
        ("ml-explore/mlx-lm v0.32", True),
        ("ml-explore/mlx-lm 0.32.0", False),  # neither a commit nor a tag: the v is needed
        ("ml-explore/mlx-lm vlatest", False),
        ("ml-explore/mlx-lm v0.32.0 and more", False),
    ],
)
def test_a_reference_is_an_issue_a_commit_or_a_release_tag(reference: str, loads_: bool) -> None:
    text = GOOD.replace('reference = "ml-explore/mlx-lm#1"', f'reference = "{reference}"')
    if loads_:
        assert loads(CHECKS, text)[0].reference == reference
    else:
        with pytest.raises(CatalogueError, match="is not owner/repo#N"):
            loads(CHECKS, text)


def test_a_name_given_twice_and_a_regression_row_without_its_guard_are_refused() -> None:
    with pytest.raises(CatalogueError, match="given twice"):
        loads(CHECKS, GOOD + GOOD)
    ours = GOOD.replace('engine = "mlx-lm"', f'engine = "{OURS}"')
    ours = ours.replace('"0.31.0"', '"15ee2e5"').replace(
        'reference = "ml-explore/mlx-lm#1"', 'reference = "this repository 15ee2e5"'
    )
    with pytest.raises(CatalogueError, match="needs a 'guard'"):
        loads(CHECKS, ours)
    assert loads(CHECKS, ours.replace("runner", 'guard = "t"\nrunner'))


def test_the_command_runs_the_stock_preset_with_the_entrys_budget(tmp_path: Path) -> None:
    run = command(stub_bug(), "buggy", Path("/v/bin/python"), tmp_path, examples=7)
    words = run.argv
    assert words[:3] == ["/v/bin/python", "-m", "pytest"]
    assert "--prefixcache-engine=pytest_prefixcache.adapters.presets:mlx_lm_server" in words
    assert words[words.index("-k") + 1] == "test_waves"
    assert "--prefixcache-examples=7" in words and "--prefixcache-seed=1" in words
    assert f"--prefixcache-model={ROOT / 'fixtures' / 'tiny-llama'}" in words
    assert "-x" in words and "--prefixcache-progress=1" in words
    assert "--prefixcache-timeout=30" in words  # history_runner.TIMEOUTS says why
    seed = command(stub_bug(runner="rapid-mlx", concurrency=1), "buggy", Path("p"), tmp_path)
    assert not any(w.startswith("--prefixcache-timeout") for w in seed.argv)  # the default
    assert run.env == {"PREFIXCACHE_CONCURRENCY": "8"}
    assert run.shell().startswith("PREFIXCACHE_CONCURRENCY=8 /v/bin/python -m pytest")
    whole = command(stub_bug(select="", examples=12), "fixed", Path("p"), tmp_path)
    assert "-k" not in whole.argv and "--prefixcache-examples=12" in whole.argv


def test_an_entry_with_flags_runs_a_one_combination_matrix(tmp_path: Path) -> None:
    bug = stub_bug(flags="--prompt-cache-size 1 --decode-concurrency 2")
    (tmp_path / "matrix.toml").write_text(matrix_text(bug))
    (target,) = read_matrix(tmp_path / "matrix.toml")  # the plugin's own parser
    assert target.flags == ("--prompt-cache-size", "1", "--decode-concurrency", "2")
    assert target.args == {"concurrency": 8}
    run = command(bug, "buggy", Path("p"), tmp_path)
    assert f"--prefixcache-matrix={tmp_path / 'matrix.toml'}" in run.argv
    assert not any(w.startswith("--prefixcache-engine") for w in run.argv)
    untapped = stub_bug(tap=False)
    (tmp_path / "matrix.toml").write_text(matrix_text(untapped))
    (target,) = read_matrix(tmp_path / "matrix.toml")
    assert target.args == {"concurrency": 8, "tap": False} and not target.flags
    assert any(
        w.startswith("--prefixcache-matrix")
        for w in command(untapped, "buggy", Path("p"), tmp_path).argv
    )


def test_an_mlx_vlm_entry_without_the_tap_serves_mlx_vlm_server_itself(tmp_path: Path) -> None:
    from pytest_prefixcache.adapters.presets import mlx_vlm_server

    vlm = stub_bug(runner="mlx-vlm", model="tiny-gemma3", images=False, concurrency=4)
    (tmp_path / "matrix.toml").write_text(matrix_text(replace(vlm, tap=False)))
    (target,) = read_matrix(tmp_path / "matrix.toml")
    assert target.args == {"tap": False, "images": False}  # no concurrency: the env's
    untapped = mlx_vlm_server(ROOT / "fixtures" / "tiny-gemma3", **target.args)
    cmd = untapped.server.cmd  # type: ignore[union-attr]
    assert cmd[1:3] == ["-m", "mlx_vlm.server"] and "pytest_prefixcache.tap" not in cmd
    assert not untapped.readout.tap and "--top-logprobs-k" in cmd
    (tmp_path / "matrix.toml").write_text(matrix_text(vlm))  # the control: the tap by default
    (target,) = read_matrix(tmp_path / "matrix.toml")
    tapped = mlx_vlm_server(ROOT / "fixtures" / "tiny-gemma3", **target.args)
    assert tapped.readout.tap and "pytest_prefixcache.tap" in tapped.server.cmd  # type: ignore[union-attr]
    assert "mlx_vlm.server.cli:main" in tapped.server.cmd  # type: ignore[union-attr]


def test_a_row_names_how_its_run_reaches_the_bug() -> None:
    plain = row(stub_bug(), None)
    assert "mlx-lm (tiny-llama, waves of 8) |" in plain and "scenario" not in plain
    shaped = row(stub_bug(corpus="next_turn_while_decoding.json", tap=False), None)
    assert "mlx-lm (tiny-llama, waves of 8, no tap, scenario next_turn_while_decoding) |" in shaped


def test_each_series_runs_on_its_own_mlx() -> None:
    assert mlx_for(stub_bug(), "buggy") == "0.31.2"
    assert mlx_for(stub_bug(fixed="0.30.4"), "fixed") == "0.30.6"
    with pytest.raises(ValueError, match=re.escape("0.25 series")):
        mlx_for(stub_bug(buggy="0.25.0"), "buggy")


LOG = "\n".join(  # the plugin's progress lines, as a run on mlx-lm 0.31.0 printed them
    [
        "prefixcache: 0 requests (0 with cache hits) in 1 streams, 0 failed test(s); 12s",
        "prefixcache: 2 requests (0 with cache hits) in 2 streams, 0 failed test(s); 39s",
        "prefixcache: 3 requests (0 with cache hits) in 3 streams, 0 failed test(s), "
        "shrinking: 1 failing example(s) so far; 1m09s",
        "prefixcache: 4 requests (0 with cache hits) in 4 streams, 1 failed test(s); 1m36s",
    ]
)


def test_the_seconds_to_the_first_failure_come_from_the_first_failing_progress_line() -> None:
    assert first_failure_seconds(LOG) == 69
    assert first_failure(LOG) == (69, 3, 3)  # the clock, the streams and requests by then
    clean = "\n".join(x for x in LOG.splitlines() if "shrinking" not in x and "1 failed" not in x)
    assert first_failure_seconds(clean) is None  # the control: no failing line, no figure


def test_the_pattern_reads_the_plugins_own_progress_line() -> None:
    lines: list[str] = []
    progress = Progress(1e-9, lines.append)
    progress.show({"requests": 3, "hits": 1, "streams": 2, "failures": 0}, failing=1)
    progress.show({"requests": 3, "hits": 1, "streams": 2, "failures": 0})
    assert first_failure_seconds(lines[0]) == 0
    assert first_failure_seconds(lines[1]) is None  # the control: nothing failing yet


def test_a_report_is_parsed_into_the_sides_outcome(tmp_path: Path) -> None:
    stream = tmp_path / "s"
    stream.mkdir()
    (stream / "stream.json").write_text(json.dumps({"requests": [{}, {}, {}]}))
    suite = {
        "verdict": "FAIL",
        "requests": 40,
        "cache_hits": 9,
        "failures_by_check": {"equivalence": 1},
        "failures": [
            {
                "check": "equivalence",
                "summary": "logits differ",
                "test": "test_waves",
                "stream_dir": str(stream),
            }
        ],
    }
    got = parse(suite, LOG, 1)
    assert (got["verdict"], got["check"], got["example"]) == (
        "FAIL",
        "equivalence",
        "logits differ",
    )
    assert (got["shrunk_requests"], got["seconds_to_failure"]) == (3, 69)
    assert got["examples_to_failure"] == 3
    passed = parse({"verdict": "PASS", "failures": [], "requests": 3}, LOG, 0)
    assert (passed["verdict"], passed["check"], passed["seconds_to_failure"]) == (
        "PASS",
        None,
        None,
    )
    assert parse(None, "Traceback\nImportError: no mlx_lm", 1)["verdict"] == "ERROR"
    # a seed run with the audit off: partial only for the cold baseline is a pass
    audit_off = {"verdict": "partial", "allow_partial": True, "failures": []}
    audit_off["not_checked"] = {"cold baseline": {"the audit's fresh servers are off": 45}}
    assert parse(audit_off, LOG, 0)["verdict"] == "PASS (partial: not checked: cold baseline)"
    other_gap = {**audit_off, "not_checked": {"equivalence": {"no logits": 3}}}
    assert parse(other_gap, LOG, 0)["verdict"] == "PARTIAL"  # control: another check unrun
    assert stream_size(None) is None and stream_size(str(tmp_path / "missing")) is None
    (stream / "stream.json").write_text(json.dumps({"waves": [[{}, {}], [{}]]}))
    assert stream_size(str(stream)) == 3


def test_an_installed_environment_is_reused_without_pip(tmp_path: Path, monkeypatch) -> None:
    bug = stub_bug()
    venv = tmp_path / "mlx-lm-0.31.0" / "bin"
    venv.mkdir(parents=True)
    (venv.parent / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    fake = venv / "python"  # answers the version probe as the real one would
    fake.write_text('#!/bin/sh\ncase "$2" in *mlx-lm*) echo 0.31.0;; *) echo 0.31.2;; esac\n')
    fake.chmod(0o755)
    monkeypatch.setenv("HISTORY_DIR", str(tmp_path))
    called: list[list[str]] = []
    real = subprocess.run

    def run(argv: list[str], **kwargs: object) -> object:
        if "pip" in argv or "venv" in argv:  # no install in CI: record it
            called.append(argv)
            return None
        return real(argv, **kwargs)  # the version probes run the fake interpreter

    monkeypatch.setattr("history_runner.subprocess.run", run)
    assert install(bug, "buggy") == fake and not called
    fake.write_text("#!/bin/sh\necho 0.30.0\n")  # the control: another version reinstalls
    with pytest.raises(RuntimeError, match="did not install"):
        install(bug, "buggy")
    assert any("mlx-lm==0.31.0" in argv and "mlx==0.31.2" in argv for argv in called)


def _result(buggy: str, check: str | None, fixed: str) -> dict[str, object]:
    return {
        "buggy": {"verdict": buggy, "check": check, "version": "1", "seconds_to_failure": 5},
        "fixed": {"verdict": fixed, "check": None, "version": "2"},
    }


def test_the_outcome_names_catches_misses_and_false_alarms() -> None:
    bug = stub_bug()
    assert outcome(bug, _result("FAIL", "equivalence", "PASS")) == "caught"
    assert outcome(bug, _result("PASS", None, "PASS")) == "missed"  # no turned_into, no why
    assert outcome(bug, _result("INCONCLUSIVE", None, "PASS")).startswith("inconclusive")
    unclean = _result("FAIL", "equivalence", "INCONCLUSIVE")  # no clean fixed side: no catch
    assert outcome(bug, unclean) == "the fixed version is inconclusive"
    assert outcome(bug, _result("FAIL", "fault", "PASS")).startswith("caught by another check")
    assert outcome(bug, _result("FAIL", "equivalence", "FAIL")).startswith("false alarm")
    once = replace(bug, replays="0 of 2")
    assert outcome(once, _result("FAIL", "equivalence", "PASS")).startswith("caught once")
    known = replace(bug, fixed_fails="another bug, #2")
    assert outcome(known, _result("FAIL", "equivalence", "FAIL")).endswith(": another bug, #2")
    assert outcome(bug, None) == "not run"
    page = render([bug], {bug.name: _result("FAIL", "equivalence", "PASS")})
    assert (
        "| caught |" in page
        and "median seconds to the first failure over the caught rows: 5 s" in page
    )
    timed_out = _result("FAIL", "timeout", "PASS")
    timed_out["buggy"].update(seconds_to_failure=None, seconds=90.0)  # no progress line counted it
    hung = replace(bug, name="x-2-hang", check="timeout", reference="o/r#2")
    page = render(
        [bug, hung], {bug.name: _result("FAIL", "equivalence", "PASS"), hung.name: timed_out}
    )
    assert "over 1 of 2" in page and "upper bound): 47.5 s over 2" in page
    assert "distinct public bugs caught in at least one configuration: 2" in page


def test_the_page_is_not_stale() -> None:
    """docs/public-record.md is what `engines/history/run.sh table` writes now; regenerate it
    after a run or a catalogue change."""
    from history_runner import RESULTS

    assert DOC.read_text() == render(load(CHECKS), load_results(RESULTS)), (
        "docs/public-record.md is stale: run engines/history/run.sh table"
    )


def models_of(bug: Bug) -> str:
    """The folder of an entry's model in its command: engines/vllm's tiny HF models for vLLM,
    else this repository's fixtures."""
    return "models" if bug.runner == "vllm" else "fixtures"


def check_results(bugs: list[Bug], results: dict[str, dict[str, Any]]) -> list[str]:
    """Problems of the results against the catalogue: a result of no entry, or of other
    versions than the entry's (a result left behind by an edit of the catalogue)."""
    by_name = {b.name: b for b in bugs}
    problems = []
    for name, r in results.items():
        bug = by_name.get(name)
        if bug is None:
            problems.append(f"results/{name}.json: no entry of that name")
        elif (r["buggy"]["version"], r["fixed"]["version"]) != (bug.buggy, bug.fixed):
            problems.append(f"results/{name}.json: versions differ from the entry's")
        elif f"{models_of(bug)}/{bug.model} " not in r["buggy"]["command"].replace("=", " ") + " ":
            problems.append(f"results/{name}.json: not run on the entry's model {bug.model}")
    return problems


def test_every_result_belongs_to_its_entry() -> None:
    from history_runner import RESULTS

    bugs, results = load(CHECKS), load_results(RESULTS)
    assert check_results(bugs, results) == []
    name = next(iter(results))
    moved = {name: {**results[name], "fixed": {**results[name]["fixed"], "version": "9.9.9"}}}
    assert check_results(bugs, moved)  # the control: another version is caught
    assert check_results(bugs, {"gone": results[name]})


def test_the_command_line_refuses_bad_words(capsys) -> None:
    assert main([]) == 2 and main(["run"]) == 2 and main(["nonsense"]) == 2
    assert main(["run", "no-such-entry"]) == 2
    assert "no runnable entry named 'no-such-entry'" in capsys.readouterr().err
    assert main(["check"]) == 0


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("PREFIXCACHE_HISTORY") != "1", reason="PREFIXCACHE_HISTORY=1")
def test_an_entry_runs() -> None:
    """Opt-in: install both versions of ``HISTORY_ENTRY`` (default the mlx-lm #976 entry) and
    run them; the buggy one fails on the expected check, the fixed one passes."""
    from history_runner import run_bug

    name = os.environ.get("HISTORY_ENTRY", "mlx-lm-976-late-binding-checkpoint")
    (bug,) = [b for b in load(CHECKS) if b.name == name]
    record = run_bug(bug)
    assert outcome(bug, record) == "caught", record


def test_the_run_words_are_shell_quoted() -> None:
    run = Run(["p", "-k", "a or b"], {"X": "1 2"}, Path("."))
    assert run.shell() == "X='1 2' p -k 'a or b'"


def test_the_seconds_to_the_first_failure_are_the_reports_own_stamp() -> None:
    quiet = LOG.splitlines()[0]  # a timeout ended the test before any line counted it
    failed = {"verdict": "FAIL", "requests": 2, "failures": [{"check": "timeout"}]}
    assert parse(failed, quiet, 1)["seconds_to_failure"] is None  # the control: no stamp
    stamp = {"seconds": 61.3, "check": "timeout", "streams": 2, "requests": 1}
    got = parse({**failed, "first_failure": stamp, "slowest_call": 0.8}, quiet, 1)
    assert (got["seconds_to_failure"], got["examples_to_failure"]) == (61.3, 2)
    assert got["timed_by"] == "stamp" and parse(failed, LOG, 1)["timed_by"] == "progress line"
    assert got["slowest_call"] == 0.8
    # the stamp wins over a later progress line; an older report falls back to the line
    assert parse({**failed, "first_failure": stamp}, LOG, 1)["seconds_to_failure"] == 61.3
    assert parse(failed, LOG, 1)["seconds_to_failure"] == 69


def test_a_miss_names_the_entry_it_was_turned_into_and_the_summary_counts_it() -> None:
    miss = stub_bug(name="x-1-miss", turned_into="x-1-thing")
    catch = stub_bug(corpus="next_turn_while_decoding.json", tap=False)
    other = stub_bug(name="x-2-miss", reference="o/r#2", why="it needs a GPU kernel")
    bugs = [catch, miss, other]
    results = {
        catch.name: _result("FAIL", "equivalence", "PASS"),
        miss.name: _result("PASS", None, "PASS"),
        other.name: _result("PASS", None, "PASS"),
    }
    by_name = {b.name: b for b in bugs}
    assert outcome(miss, results[miss.name], by_name) == (
        "missed; turned into x-1-thing by a new capability: no tap, "
        "scenario next_turn_while_decoding"
    )
    assert outcome(other, results[other.name], by_name) == "missed: it needs a GPU kernel"
    page = render(bugs, results)
    assert (
        "- misses: 2, of which 1 turned into catches by a new capability: x-1-miss by x-1-thing "
        "(no tap, scenario next_turn_while_decoding); still missed, each with its reason in its "
        "row: x-2-miss" in page
    )
    # the control: a miss turned into an entry that is not caught is not counted as turned
    results[catch.name] = _result("FAIL", "equivalence", "FAIL")
    assert "- misses: 2, of which 0 turned into catches" in render(bugs, results)


@pytest.mark.parametrize("into", ["x-1-again", "x-9-nowhere", "x-2-other"])
def test_turned_into_names_another_entry_of_the_same_bug(into: str) -> None:
    second = GOOD.replace('name = "x-1-thing"', 'name = "x-1-again"')
    other = GOOD.replace('name = "x-1-thing"', 'name = "x-2-other"').replace("#1", "#2")
    text = GOOD + second.replace("runner", f'turned_into = "{into}"\nrunner') + other
    with pytest.raises(CatalogueError, match=re.escape(f"'x-1-again'.turned_into: '{into}'")):
        loads(CHECKS, text)
    fine = GOOD + second.replace("runner", 'turned_into = "x-1-thing"\nrunner') + other
    assert loads(CHECKS, fine)[1].turned_into == "x-1-thing"  # the control


def test_every_miss_on_the_page_says_what_it_became_or_why() -> None:
    from history_runner import RESULTS

    bugs, results = load(CHECKS), load_results(RESULTS)
    by_name = {b.name: b for b in bugs}
    bare = [b.name for b in bugs if outcome(b, results.get(b.name), by_name) == "missed"]
    assert not bare, f"misses without turned_into or why: {bare}"


def test_a_stamped_row_shows_its_seconds_examples_and_load() -> None:
    stamped: dict[str, Any] = _result("FAIL", "timeout", "PASS")
    stamped["buggy"].update(seconds_to_failure=61.3, examples_to_failure=2, load=9.6)
    assert "| 61.3 (2; load 9.6) |" in row(stub_bug(), stamped)
    older: dict[str, Any] = _result("FAIL", "timeout", "PASS")  # the control: an older result
    older["buggy"].update(seconds_to_failure=None, seconds=90.0)
    assert "| <= 90.0 (the run's wall time) |" in row(stub_bug(), older)


def test_the_median_says_how_each_time_was_measured() -> None:
    one, two = stub_bug(), stub_bug(name="x-2-two", reference="o/r#2")
    new: dict[str, Any] = _result("FAIL", "equivalence", "PASS")
    new["buggy"].update(seconds_to_failure=30.0, examples_to_failure=2, timed_by="stamp")
    old = _result("FAIL", "equivalence", "PASS")  # seconds_to_failure 5, from a progress line
    page = render([one, two], {one.name: new, two.name: old})
    assert "over the caught rows: 17.5 s (measured on every one of the 2; 1 by the plugin" in page
    assert "one of the 2; 1 by the plugin's stamp, 1 by an older run's first failing" in page


def test_the_slowest_answer_of_a_fixed_side_is_shown_by_runner() -> None:
    from history_table import slowest

    fast, slow = stub_bug(), stub_bug(name="x-2-slow", reference="o/r#2")
    seed = stub_bug(name="x-3-seed", reference="o/r#3", runner="rapid-mlx", concurrency=1)
    results: dict[str, dict[str, Any]] = {
        b.name: _result("FAIL", "equivalence", "PASS") for b in (fast, slow, seed)
    }
    results[fast.name]["fixed"]["slowest_call"] = 1.5
    results[slow.name]["fixed"]["slowest_call"] = 4.25
    results[seed.name]["fixed"]["slowest_call"] = 41.8
    line = slowest([fast, slow, seed], results)
    assert "mlx-lm 4.25 s (x-2-slow, timeout 30 s); " in line
    assert "rapid-mlx 41.80 s (x-3-seed, timeout 60 s)" in line
    assert slowest([fast], {}).endswith("none recorded")  # the control: nothing recorded
