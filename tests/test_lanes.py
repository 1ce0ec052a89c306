"""The test lanes: ``slow`` and ``timing`` are registered markers, the README documents the fast
lane and CI's command records durations, and no test bounds wall time (a shared machine makes
such a bound flaky: tests assert behaviour, benchmarks measure time)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"}
FAST = 'pytest -m "not slow and not timing"'


def _is_clock(node: ast.AST) -> bool:
    """``time.monotonic()`` and the like (also a bare ``perf_counter()``)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name in CLOCKS


def _elapsed(node: ast.AST) -> bool:
    """A clock reading minus something: an elapsed time."""
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _is_clock(node.left)


def wall_time_bounds(source: str) -> list[int]:
    """Lines of ``assert`` statements that put an upper bound on an elapsed wall time
    (directly, or through a name it was assigned to). A lower bound (the budget was spent)
    cannot fail because the machine is busy, and is allowed."""
    tree = ast.parse(source)
    names = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _elapsed(node.value)
        for t in node.targets
        if isinstance(t, ast.Name)
    }

    def timed(n: ast.AST) -> bool:
        return _elapsed(n) or (isinstance(n, ast.Name) and n.id in names)

    def bounded(cmp: ast.Compare) -> bool:
        sides = [cmp.left, *cmp.comparators]
        return any(
            (timed(a) and isinstance(op, (ast.Lt, ast.LtE)))
            or (timed(b) and isinstance(op, (ast.Gt, ast.GtE)))
            for a, op, b in zip(sides, cmp.ops, sides[1:])
        )

    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Assert)
        and any(isinstance(n, ast.Compare) and bounded(n) for n in ast.walk(node.test))
    ]


def test_no_test_bounds_wall_time() -> None:
    found = {
        path.name: lines
        for path in sorted((ROOT / "tests").glob("*.py"))
        if (lines := wall_time_bounds(path.read_text(encoding="utf-8")))
    }
    assert found == {}, "assert the behaviour (the timeout fired, the hang was interrupted)"


def test_a_wall_time_bound_is_found() -> None:
    """Negative control: upper bounds, direct or through a name, are caught; a lower bound
    and waiting for a deadline are not."""
    source = (
        "import time\n"
        "start = time.monotonic()\n"
        "assert time.monotonic() - start < 25\n"
        "elapsed = time.perf_counter() - start\n"
        "assert elapsed < 2, elapsed\n"
        "assert 30 > time.time() - start >= 1\n"
        "assert elapsed >= 1\n"
        "deadline = time.monotonic() + 10\n"
        "while time.monotonic() < deadline:\n"
        "    pass\n"
        "assert True\n"
    )
    assert wall_time_bounds(source) == [3, 5, 6]


def test_the_markers_are_registered() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    markers = config["tool"]["pytest"]["ini_options"]["markers"]
    assert {m.split(":")[0] for m in markers} >= {"slow", "timing"}


def test_the_readme_documents_the_fast_lane_and_ci_records_durations() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    development = readme[readme.index("## Development") :]
    assert FAST in development
    command = re.search(r"<!-- test-command -->\n```sh\n(.+)\n", readme)
    assert command and "--durations" in command[1]
    assert "not slow" not in command[1]  # CI runs every lane
