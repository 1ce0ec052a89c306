"""The test lanes: ``slow`` and ``timing`` are registered markers, the README documents the fast
lane and CI's command records durations, and no test bounds wall time (a shared machine makes
such a bound flaky: tests assert behaviour, benchmarks measure time).

The fast lane must still catch a broken check: every mutant of the bug zoo has a fast-lane
test that names it, every check a mutant is expected to catch (bar the wall-time one) catches
one in the fast lane's detection or replay tests, the checks' own unit tests are all in it, and
every adapter module has fast-lane tests."""

from __future__ import annotations

import ast
import os
import re
import subprocess
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


#: The mutants' tests; the detection and replay tests run each mutant through the checks.
MUTANT_TESTS = ("tests/test_mutants.py", "tests/test_mutants_concurrency.py",
                "tests/test_mutants_detection.py")  # fmt: skip
DETECTION = ("tests/test_mutants_detection.py::test_mutant_is_detected_by_its_expected_check",
             "tests/test_mutants_detection.py::test_saved_counterexample_still_fails")  # fmt: skip
#: Checks judged on wall time only: their tests are ``timing`` by nature.
WALL_TIME_CHECKS = {"min speedup"}
#: Each adapter module of ``pytest_prefixcache.adapters`` and the tests of it that need no
#: third-party engine (the http subpackage is the OpenAI-compatible adapter).
ADAPTER_TESTS = {
    "http": "tests/test_adapters_openai.py",
    "hub_alias": "tests/test_hub_alias.py",
    "llama": "tests/test_adapters_llama_stub.py",
    "llama_slots": "tests/test_adapters_llama_slots.py",
    "llama_tolerance": "tests/test_llama_tolerance.py",
    "gguf_header": "tests/test_gguf_header.py",
    "mlx_lm": "tests/test_adapters_mlx_lm.py",
    "mlx_vlm_apc": "tests/test_adapters_mlx_vlm_apc.py",
    "omlx": "tests/test_adapters_omlx_stub.py",
    "seed": "tests/test_seed_preset.py",
    "sglang": "tests/test_adapters_sglang_stub.py",
    "vllm": "tests/test_adapters_vllm_stub.py",
    "vllm_identity": "tests/test_adapters_vllm_identity.py",
}
#: Modules of the package that are not adapters of their own.
NOT_ADAPTERS = {
    "__init__",
    "presets",
    "tolerances",
    "omlx_launch",
    "openai",
    "flags",
    "environment",
}
CHECK_UNITS = "tests/test_checks.py"


#: A plugin that prints each collected test's lane (the fast lane is what
#: ``-m "not slow and not timing"`` selects).
LANE_PLUGIN = """
def pytest_collection_modifyitems(items):
    for item in items:
        slow = any(item.get_closest_marker(m) for m in ("slow", "timing"))
        print("LANE", "slow" if slow else "fast", item.nodeid)
"""


def _lanes(tmp_path: Path, *paths: str) -> tuple[list[str], list[str]]:
    """The node ids of the fast lane and of every test in ``paths``, from one collection."""
    (tmp_path / "lane_plugin.py").write_text(LANE_PLUGIN, encoding="utf-8")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    res = subprocess.run(
        [*cmd, "-p", "lane_plugin", *paths],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lanes = [line.split(" ", 2)[1:] for line in res.stdout.splitlines() if line.startswith("LANE ")]
    return [n for lane, n in lanes if lane == "fast"], [n for _, n in lanes]


def lane_gaps(fast: list[str], every: list[str]) -> dict[str, list[str]]:
    """What the fast lane (node ids ``fast``, out of ``every``) leaves untested: mutants no
    fast test names, checks no fast detection or replay catches, checks' unit tests and
    adapters' test files outside the fast lane."""
    from reference_engine.mutants import MUTANTS

    caught = {
        MUTANTS[name].expected_check
        for node in fast
        if node.startswith(DETECTION)
        for name in MUTANTS
        if re.search(rf"\[(mutant_)?{name}\]$", node)
    }
    checks = {m.expected_check for m in MUTANTS.values()} - WALL_TIME_CHECKS
    adapter_files = set(ADAPTER_TESTS.values())
    return {
        "mutants": sorted(n for n in MUTANTS if not any(n in node for node in fast)),
        "checks": sorted(checks - caught),
        "check units": sorted(n for n in every if n.startswith(CHECK_UNITS) and n not in set(fast)),
        "adapters": sorted(
            a for a, f in ADAPTER_TESTS.items() if not any(n.startswith(f) for n in fast)
        ),
        "adapter files": sorted(
            f for f in adapter_files if not any(n.startswith(f) for n in every)
        ),
    }


def test_every_adapter_module_has_its_tests_listed() -> None:
    package = ROOT / "pytest_prefixcache" / "adapters"
    modules = {p.stem for p in package.glob("*.py")} | {
        p.name for p in package.iterdir() if (p / "__init__.py").is_file()
    }
    assert modules - NOT_ADAPTERS == set(ADAPTER_TESTS)


def test_the_fast_lane_tests_every_mutant_check_and_adapter(tmp_path: Path) -> None:
    pytest.importorskip("mlx.core")
    fast, every = _lanes(tmp_path, *MUTANT_TESTS, CHECK_UNITS, *ADAPTER_TESTS.values())
    assert len(every) > len(fast) > 0
    gaps = lane_gaps(fast, every)
    assert gaps == {k: [] for k in gaps}, "give each a fast test, or make its test cheaper"


def test_a_lane_gap_is_found() -> None:
    """Negative control: without the detection tests, the checks only mutants exercise through
    the verifier are gaps; without a mutant's, an adapter's or a unit test, those are."""
    pytest.importorskip("mlx.core")
    from reference_engine.mutants import MUTANTS

    every = [
        *(f"{DETECTION[0]}[{n}]" for n in MUTANTS),
        f"{CHECK_UNITS}::test_reuse_bound",
        *(f"{f}::test_x" for f in ADAPTER_TESTS.values()),
    ]
    assert lane_gaps(every, every) == {
        "mutants": [],
        "checks": [],
        "check units": [],
        "adapters": [],
        "adapter files": [],
    }
    fast = [
        n
        for n in every
        if not n.endswith(("[never_stores]", "[salt_dropped_for_images]", "::test_reuse_bound"))
        and not n.startswith(ADAPTER_TESTS["seed"])
    ]
    gaps = lane_gaps(fast, every)
    assert gaps["mutants"] == ["never_stores", "salt_dropped_for_images"]  # both: positive control
    assert gaps["checks"] == ["positive control"]
    assert gaps["check units"] == [f"{CHECK_UNITS}::test_reuse_bound"]
    assert gaps["adapters"] == ["seed"]
    assert gaps["adapter files"] == []
    assert lane_gaps([], [])["adapter files"] == sorted(ADAPTER_TESTS.values())
