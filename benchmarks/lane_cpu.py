"""The CPU time of each test, for sorting tests into lanes on a shared machine.

Wall time on a machine other runs load says little; CPU time (this process's threads and
every child it waited for: pytester subprocesses, servers stopped by the test) barely moves.
As a pytest plugin it appends ``node id, CPU s, wall s`` for each test to
``$LANE_CPU_DIR/cpu-<xdist worker>.tsv``; as a script it sums those files and lists the tests
that cost the most::

    PYTHONPATH=benchmarks LANE_CPU_DIR=out nice -n 10 /usr/bin/time -v \\
        .venv/bin/pytest -p lane_cpu -m "not slow and not timing" -n 2 --durations=0 -q
    .venv/bin/python benchmarks/lane_cpu.py out --top 20

A server a session-scoped fixture starts is charged to no test (its CPU shows in
``/usr/bin/time``'s total once the session reaps it). On 2 idle cores, two workers take
about the total CPU time over 2 in wall time.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

_out: IO[str] | None = None


def cpu_seconds() -> float:
    """User and system time of this process and of the children it has waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    global _out
    if _out is None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        folder = Path(os.environ.get("LANE_CPU_DIR", "."))
        folder.mkdir(parents=True, exist_ok=True)
        _out = (folder / f"cpu-{worker}.tsv").open("a", encoding="utf-8")
    cpu, wall = cpu_seconds(), time.monotonic()
    yield
    _out.write(f"{item.nodeid}\t{cpu_seconds() - cpu:.2f}\t{time.monotonic() - wall:.2f}\n")
    _out.flush()


def read(folder: Path) -> list[tuple[str, float, float]]:
    """(node id, CPU s, wall s) of every test the files in ``folder`` hold."""
    rows = []
    for path in sorted(folder.glob("cpu-*.tsv")):
        for line in path.read_text(encoding="utf-8").splitlines():
            node, cpu, wall = line.rsplit("\t", 2)
            rows.append((node, float(cpu), float(wall)))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the LANE_CPU_DIR of a run")
    parser.add_argument("--top", type=int, default=20, help="list the N costliest tests")
    args = parser.parse_args(argv)
    rows = read(args.folder)
    total = sum(cpu for _, cpu, _ in rows)
    print(f"{len(rows)} tests, {total:.0f} s of CPU in tests (about {total / 2:.0f} s on 2 cores)")
    for node, cpu, wall in sorted(rows, key=lambda r: -r[1])[: args.top]:
        print(f"{cpu:8.2f} {wall:8.2f}  {node}")


if __name__ == "__main__":
    main()
