"""The detection table in CI: every mutant, a small budget, a fixed seed, no shrinking; each
must be caught by its expected check, and the unmodified engine must pass the same run.

The lanes: a mutant's detection (it stops at the first failing example) and its saved
counterexample's replay are cheap and run in the fast lane (so a check that stops catching
its bug fails there); the races (class 10) wait on thread timing (``timing``); the unmodified
engine's whole runs, one per configuration, and the command-line runs are ``slow``.

The full table (default budget, with shrinking) is the benchmark:
``python -m reference_engine.mutants --table``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

mx = pytest.importorskip("mlx.core")

from pytest_prefixcache.errors import VerificationFailure  # noqa: E402
from pytest_prefixcache.output.streams import load_stream, waves_from  # noqa: E402
from pytest_prefixcache.verify.restarts import restarts_from, run_restart_stream  # noqa: E402
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions  # noqa: E402
from reference_engine import Engine  # noqa: E402
from reference_engine.kvquant import KVQuant  # noqa: E402
from reference_engine.model import LoadedModel  # noqa: E402
from reference_engine.mutants import MUTANTS, PROTOCOL_CHECKS  # noqa: E402
from reference_engine.mutants.kvquant import SwitchingKV  # noqa: E402
from reference_engine.mutants.table import detect, detect_in_corpus, stream_size  # noqa: E402

EXAMPLES = 10
#: Fixtures whose examples cost several times more (the recurrent family: docs/benchmarks.md,
#: "The test suite's lanes"). Its mutants and its unmodified run use these many (the same run:
#: a different budget draws different examples); each of its four mutants is still caught.
FIXTURE_EXAMPLES = {"tiny-qwen3.5-vl": 4}
SEED = 0
ROOT = Path(__file__).resolve().parent.parent
CORPUS = sorted((ROOT / "fixtures" / "corpus" / "mutants").glob("mutant_*.json"))

#: Every opt-in check the mutants use (``--prefixcache-min-speedup=1``).
OPT_IN = {k: v for m in MUTANTS.values() for k, v in m.verify.items()}
#: The engine-call timeout: generous, so that only a hang fails on a busy machine (the default
#: one failed a first call on the recurrent family with both cores loaded by other runs).
TIMEOUT = {"timeout": 600.0}

#: Races (class 10): only the waves catch them, when the timing lets the race happen, so they
#: get more examples (the streams run first and see nothing), and more seeds until one shows.
#: Measured (benchmarks alone, two at once): evict_in_use's first failing wave at seed 0 is
#: the 24th of 30, at seeds 1-3 the 7th to 12th; the other three by the 10th. ragged_decode
#: (waves that decode, 0f06c80): the 3rd wave at seed 0 (``python -m reference_engine.mutants
#: --table ragged_decode``); before, not in 20 waves at seeds 0 and 1.
RACES = {
    "wrong_batch_row": 30,
    "read_before_write": 30,
    "evict_in_use": 30,
    "ragged_batch": 30,
    "ragged_decode": 30,
}
RACE_SEEDS = 3
#: Replays of a saved race: at least one must fail (measured: 3 to 6 of 10 replays fail).
RACE_REPLAYS = 15

#: Mutants that only the scenario corpus catches (the generated streams do not, yet).
CORPUS_ONLY = {
    "weak_image_hash": "streams rarely hold two same-size solid images whose bytes fold alike",
    "volatile_header_kept": "streams never carry a volatile header line in the system prompt",
}


def examples_on(fixture: str) -> int:
    """The generated examples a run on ``fixture`` gets (its mutants' and the unmodified
    engine's)."""
    return FIXTURE_EXAMPLES.get(fixture, EXAMPLES)


def _cases() -> list[object]:
    out: list[object] = []
    for name, m in MUTANTS.items():
        marks = []
        if m.expected_check not in PROTOCOL_CHECKS:
            marks.append(pytest.mark.skip(reason=f"needs a {m.expected_check} check"))
        if "min_speedup" in m.verify or name in RACES:  # wall time, or thread timing
            marks.append(pytest.mark.timing)
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("name", _cases())
def test_mutant_is_detected_by_its_expected_check(models: Any, name: str) -> None:
    mutant = MUTANTS[name]
    engine = mutant.build(models(mutant.model))
    if mutant.switch is not None:  # a bug that shows after a switch of the KV setting
        engine = SwitchingKV(engine, mutant.switch)  # type: ignore[assignment]
    if name in CORPUS_ONLY:
        failed = detect_in_corpus(engine, {**mutant.verify, **TIMEOUT})
        assert mutant.expected_check in {check for _, check in failed}, (name, failed)
        return
    examples = RACES.get(name, examples_on(mutant.model))
    verify = {**mutant.verify, **TIMEOUT}
    seeds = range(SEED, SEED + (RACE_SEEDS if name in RACES else 1))
    for seed_value in seeds:
        engine.reset()
        row = detect(
            engine, name=name, examples=examples, seed_value=seed_value, shrink=False, verify=verify
        )
        if row.detected:
            break
    assert row.detected, f"{name} was not detected in {examples} examples (seeds {list(seeds)})"
    assert row.check == mutant.expected_check, (name, row.check, row.headline)


def test_unmodified_engine_passes_the_corpus(model: LoadedModel) -> None:
    assert detect_in_corpus(Engine(model), {**OPT_IN, **TIMEOUT}) == []


#: Every configuration a mutant runs with (its fixture, engine options, opt-in checks): the
#: unmodified engine must pass each. (A token-granular cache is slower than no cache on this
#: tiny model, so the speedup check is only on where its mutant runs.)
Config = tuple[str, tuple[tuple[str, int], ...], tuple[tuple[str, float], ...]]
CONFIGS: list[Config] = sorted(
    {
        (m.model, tuple(sorted(m.options.items())), tuple(sorted(m.verify.items())))
        for m in MUTANTS.values()
    }
)


def _config_id(config: Config) -> str:
    settings = "-".join(
        f"{k}={v.label if isinstance(v, KVQuant) else v if isinstance(v, str) else format(v, 'g')}"
        for part in config[1:]
        for k, v in part
    )
    return f"{config[0]}-{settings or 'default'}"


def _config_params() -> list[object]:
    """One param per configuration; those judged on wall time (min_speedup) marked timing."""
    return [
        pytest.param(
            c,
            id=_config_id(c),
            marks=[pytest.mark.timing] if any(k == "min_speedup" for k, _ in c[2]) else [],
        )
        for c in CONFIGS
    ]


@pytest.mark.slow
@pytest.mark.parametrize("config", _config_params())
def test_unmodified_engine_passes_the_same_run(models: Any, config: Config) -> None:
    fixture, options, verify = config
    engine = Engine(models(fixture), **dict(options))
    examples = examples_on(fixture)
    row = detect(
        engine,
        name="reference",
        examples=examples,
        seed_value=SEED,
        shrink=False,
        verify={**dict(verify), **TIMEOUT},
    )
    assert not row.detected, row.headline
    assert row.examples == examples * 2  # the streams, then the waves (it serves 4 at once)


def _corpus_params() -> list[object]:
    """One param per saved counterexample; a saved race (replayed until it shows) is timing."""
    races = {f"mutant_{name}" for name in RACES}
    return [
        pytest.param(p, id=p.stem, marks=[pytest.mark.timing] if p.stem in races else [])
        for p in CORPUS
    ]


@pytest.mark.parametrize("path", _corpus_params())
def test_saved_counterexample_still_fails_and_the_engine_passes(
    models: Any, path: Path, tmp_path: Path
) -> None:
    stream, meta = load_stream(path)
    name = json.loads(path.read_text())["mutant"]
    mutant = MUTANTS[name]
    model = models(mutant.model)
    options = VerifyOptions(failures_dir=tmp_path, **mutant.verify, **TIMEOUT)  # type: ignore[arg-type]
    waves = waves_from(stream, meta)
    if waves is not None:  # a race: replayed until it shows (the reference never fails)
        checks = []
        engine = mutant.build(model)
        for _ in range(RACE_REPLAYS):
            try:
                Verifier(engine, options=options).run_waves(waves)
            except VerificationFailure as exc:
                checks.append(exc.check)
                break
        Verifier(Engine(model, **mutant.options), options=options).run_waves(waves)
        assert max(len(w) for w in waves) <= 4, meta
        if not checks:  # timing: tests/test_mutants_concurrency.py forces the same race
            pytest.skip(f"{name}: the race did not show in {RACE_REPLAYS} replays on this machine")
        assert checks == [mutant.expected_check], f"{name}: {checks} in {RACE_REPLAYS} replays"
        return
    restarts = restarts_from(stream, meta)
    if restarts is not None:  # a disk-tier mutant: replayed with its restarts
        with pytest.raises(VerificationFailure) as info:
            run_restart_stream(Verifier(mutant.build(model), options=options), restarts)
        assert info.value.check == mutant.expected_check
        engine = Engine(model, **mutant.options, cache_dir=tmp_path / "kv")
        run_restart_stream(Verifier(engine, options=options), restarts)
    else:
        built = mutant.build(model)
        if mutant.switch is not None:
            built = SwitchingKV(built, mutant.switch)  # type: ignore[assignment]
        with pytest.raises(VerificationFailure) as info:
            Verifier(built, options=options).run(stream)
        assert info.value.check == mutant.expected_check
        Verifier(Engine(model, **mutant.options), options=options).run(stream)
    requests, _, images = stream_size(stream)
    assert requests <= 4 and images <= 2, meta


@pytest.mark.slow
def test_mutant_is_selectable_from_the_command_line(tmp_path: Path) -> None:
    """``--prefixcache-engine=reference_engine.mutants:NAME`` replaying the saved case, four
    times: each run must exit with pytest's own code 1. When the worker thread that ran MLX
    work was stopped at close, about half of these runs aborted at exit (-6) after reporting
    correctly (11 of 20); the worker now stays an idle daemon and MLX is drained from the main
    thread (0 of 30, and 0 of 16 with both cores busy)."""
    case = ROOT / "fixtures" / "corpus" / "mutants" / "mutant_placeholder_collision.json"
    if not case.is_file():
        pytest.skip("no saved counterexample for placeholder_collision")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--prefixcache-verify",
        "--prefixcache-engine=reference_engine.mutants:placeholder_collision",
        f"--prefixcache-replay={case}",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    for _ in range(4):
        res = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        out = res.stdout + res.stderr
        assert res.returncode == 1, out
        assert "equivalence" in out and "logits differ" in out, out
