"""The default verification on each model family the fixtures hold, as a user runs it:
``pytest --prefixcache-verify --prefixcache-model=NAME`` passes on the reference engine, and a
family's mutant, named alone, loads the family it needs and is caught."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("mlx.core")

pytest_plugins = ["pytester"]

#: Whole verifications on each model family: minutes on 2 cores (the slow lane).
pytestmark = pytest.mark.slow

FAMILIES = ["tiny-qwen3.5-vl", "tiny-gemma3", "tiny-gemma4"]
ROOT = Path(__file__).resolve().parent.parent


def verify(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--prefixcache-verify",
        "--pyargs",
        "pytest_prefixcache.suite",
        "--prefixcache-examples=3",
        "--prefixcache-seed=1",
        *args,
    )


@pytest.mark.parametrize("name", FAMILIES)
def test_the_default_engine_passes_on_the_family(pytester: pytest.Pytester, name: str) -> None:
    result = verify(pytester, f"--prefixcache-model={name}")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(
        [
            f"*model: *{name}*",
            "worst |cached - uncached|: 0",
            "failures by check: none",
            "verdict: PASS",
        ]
    )


def test_a_family_mutant_alone_loads_its_family_and_is_caught(pytester: pytest.Pytester) -> None:
    """Its saved counterexample replayed, in seconds (the generated streams catch it too:
    tests/test_mutants_detection.py; a whole run that shrinks every failing stream takes
    minutes)."""
    case = ROOT / "fixtures" / "corpus" / "mutants" / "mutant_ring_trimmed_after_wrap.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--prefixcache-verify",
        "--prefixcache-engine=reference_engine.mutants:ring_trimmed_after_wrap",
        f"--prefixcache-replay={case}",
    )
    assert result.ret == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*equivalence*", "verdict: FAIL*"])


def test_every_family_mutant_builds_on_its_family(monkeypatch: pytest.MonkeyPatch) -> None:
    import reference_engine.mutants as zoo

    monkeypatch.delenv("PREFIXCACHE_MODEL", raising=False)
    for name, mutant in zoo.MUTANTS.items():
        if mutant.bug_class in (16, 17):
            engine = getattr(zoo, name)()
            assert engine.model.path.name == mutant.model != "tiny-qwen2-vl", name
            assert engine.model.stateful_layers, name
