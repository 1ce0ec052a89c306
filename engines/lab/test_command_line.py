"""engines/lab/command_line.py: a findings script's word runs with its arguments and prints its
lines; a wrong word or argument count prints the usage and exits 2 (and runs nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.command_line import Command, at_least, dispatch, mode_commands

USAGE = "usage: findings.py table REPORTS | rows A B..."


def test_a_word_runs_with_its_arguments_and_prints_its_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen: list[list[str]] = []

    def rows(a: list[str]) -> list[str]:
        seen.append(a)
        return [f"row {x}" for x in a]

    commands = {"rows": Command(at_least(2), rows), "table": Command({1}, lambda a: ["t"])}
    assert dispatch(["rows", "a", "b", "c"], commands, USAGE) == 0
    assert seen == [["a", "b", "c"]]
    assert capsys.readouterr() == ("row a\nrow b\nrow c\n", "")


WRONG = [[], ["tables", "x"], ["table"], ["table", "x", "y"], ["rows", "a"]]


@pytest.mark.parametrize("argv", WRONG)
def test_anything_else_prints_the_usage_and_runs_nothing(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[list[str]] = []

    def record(args: list[str]) -> list[str]:
        ran.append(args)
        return []

    commands = {"rows": Command(at_least(2), record), "table": Command({1}, record)}
    assert dispatch(argv, commands, USAGE) == 2
    assert ran == []
    assert capsys.readouterr() == ("", USAGE + "\n")


def test_the_mode_words_write_a_row_and_print_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def row(directory: Path, engine: str, version: str, mode: str) -> dict[str, object]:
        return {"engine": engine, "mode": mode, "requests": 3, "efficiency": None, "failures": []}

    commands = mode_commands(
        row=row, table=lambda p: f"table of {p.name}", prefix="x", findings=["a"], script="s"
    )
    (tmp_path / "x-a").mkdir()
    assert dispatch(["row", str(tmp_path / "x-a"), "eng", "1.0", "a"], commands, USAGE) == 0
    assert json.loads((tmp_path / "x-a" / "row.json").read_text())["engine"] == "eng"
    assert dispatch(["table", str(tmp_path)], commands, USAGE) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        '{"engine": "eng", "mode": "a", "requests": 3, "efficiency": null}',
        f"table of {tmp_path.name}",
    ]
    assert dispatch(["row", str(tmp_path / "x-a"), "eng", "1.0"], commands, USAGE) == 2
