"""The command line of the lab's findings scripts (engines/*/findings.py,
engines/llama/matrix_findings.py): a word, its arguments, the lines it prints; the script's usage
on stderr (exit status 2) for anything else.

A script declares its words as :class:`Command` values and hands them to :func:`dispatch`; the
words every per-mode script has (``row``, ``table``, ``save``) come from :func:`mode_commands`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .findings import save

__all__ = [
    "Command",
    "at_least",
    "dispatch",
    "mode_commands",
    "row_lines",
    "saved_lines",
    "table_lines",
]


@dataclass(frozen=True)
class Command:
    """One word of a findings script: ``counts``, how many arguments may follow it; ``run``,
    called with them, returns (or yields) the lines to print."""

    counts: Collection[int]
    run: Callable[[list[str]], Iterable[str]]


def dispatch(argv: Sequence[str], commands: Mapping[str, Command], usage: str) -> int:
    """Run the command ``argv`` names and print its lines (0), or print ``usage`` (2)."""
    command = commands.get(argv[0]) if argv else None
    if command is None or len(argv) - 1 not in command.counts:
        print(usage, file=sys.stderr)
        return 2
    for line in command.run(list(argv[1:])):
        print(line)
    return 0


def at_least(n: int) -> range:
    """Argument counts of a word that takes ``n`` or more."""
    return range(n, sys.maxsize)


def row_lines(rows: Iterable[dict[str, Any]], keys: Sequence[str]) -> Iterator[str]:
    """A line of JSON per row, with its ``keys``: what a script says of the rows it wrote."""
    for r in rows:
        yield json.dumps({k: r[k] for k in keys})


def saved_lines(corpus: Path, names: Iterable[str]) -> Iterator[str]:
    """``saved CORPUS/NAME`` per counterexample saved."""
    for name in names:
        yield f"saved {corpus / name}"


def table_lines(table: Callable[[Path], str]) -> Command:
    """``table REPORTS``: the Markdown table of the rows under REPORTS."""
    return Command({1}, lambda a: [table(Path(a[0]))])


def mode_commands(
    *,
    row: Callable[[Path, str, str, str], dict[str, Any]],
    table: Callable[[Path], str],
    prefix: str,
    findings: Sequence[str],
    script: str,
) -> dict[str, Command]:
    """The words of a script with a report directory per mode: ``row DIR ENGINE VERSION MODE``
    writes DIR/row.json; ``table REPORTS`` prints the table; ``save REPORTS CORPUS`` saves the
    failures of the ``findings`` modes (``<prefix>-<mode>/row.json``; not the negative
    controls, which are no findings about the engine)."""

    def write_row(a: list[str]) -> Iterator[str]:
        directory = Path(a[0])
        r = row(directory, a[1], a[2], a[3])
        (directory / "row.json").write_text(json.dumps(r, indent=1) + "\n")
        return row_lines([r], ("engine", "mode", "requests", "efficiency"))

    def save_modes(a: list[str]) -> Iterator[str]:
        for mode in findings:
            pattern = f"{prefix}-{mode}/row.json"
            yield from saved_lines(Path(a[1]), save(Path(a[0]), Path(a[1]), pattern, script))

    return {
        "row": Command({4}, write_row),
        "table": table_lines(table),
        "save": Command({2}, save_modes),
    }
