"""The detection table: the default verification run against every mutant.

For each mutant (and the unmodified engine, which must pass) this runs what
``pytest --prefixcache-verify`` runs: the scenario corpus (:func:`detect_in_corpus`, each
scenario with its render expectations), then generated streams (:func:`detect`:
``request_streams()`` with the suite's share of closed-loop streams, through a
``Verifier``, Hypothesis seeded, the default budget). It records which scenario failed and
by which check, and for the generated streams whether a check failed, which one, after how
many examples and seconds, and how small Hypothesis shrank the stream. The bug zoo's own
counterexamples (``fixtures/corpus/mutants/``) are not part of the corpus run.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import HypothesisException

from pytest_prefixcache.errors import VerificationFailure
from pytest_prefixcache.output.streams import corpus_files, load_stream
from pytest_prefixcache.strategies import (
    CLOSED_LOOP_SHARE,
    Restart,
    request_streams,
    request_waves,
    restart_streams,
)
from pytest_prefixcache.traits import traits_of
from pytest_prefixcache.types import Engine as EngineProtocol
from pytest_prefixcache.types import Request, Wave
from pytest_prefixcache.verify.concurrent import max_concurrency
from pytest_prefixcache.verify.restarts import (
    declares_restart,
    restart_changes,
    run_restart_stream,
)
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions

from ..engine import Engine
from ..model import LoadedModel, load_model
from . import MUTANTS, PROTOCOL_CHECKS, Mutant
from .kvquant import SwitchingKV

__all__ = [
    "Detection",
    "detect",
    "detect_in_corpus",
    "detection_table",
    "format_table",
    "stream_size",
]

#: The row name of the unmodified engine (the false-positive control).
REFERENCE = "reference (no bug)"

#: The verifier only names replay paths (nothing is written there).
_OPTIONS = VerifyOptions(failures_dir=Path(tempfile.gettempdir()) / "prefixcache-zoo", timeout=60.0)


@dataclass
class Detection:
    """What one verification run found."""

    name: str
    bug_class: int | None
    expected: str | None
    detected: bool = False
    check: str | None = None
    """The check of the first failure (before shrinking)."""
    shrunk_check: str | None = None
    examples: int = 0
    """Examples run up to and including the first failing one (all of them if none failed)."""
    seconds: float | None = None
    """Seconds from the start to the first failure."""
    total_seconds: float = 0.0
    size: tuple[int, int, int] | None = None
    """(requests, most user turns in one request, distinct images) of the shrunk stream."""
    stream: tuple[Request, ...] = field(default=(), repr=False)
    meta: dict[str, Any] = field(default_factory=dict, repr=False)
    """What the failure saves beside the stream (the waves of a concurrent one)."""
    headline: str = ""
    corpus: list[tuple[str, str]] = field(default_factory=list)
    """(scenario, check) for every corpus scenario that failed."""
    scenarios: int = 0
    """Corpus scenarios run."""

    @property
    def as_expected(self) -> bool:
        if self.expected is None:
            return not (self.detected or self.corpus)
        checks = {self.check, self.shrunk_check, *(c for _, c in self.corpus)}
        return self.expected in checks


def stream_size(stream: Sequence[Request]) -> tuple[int, int, int]:
    """(requests, most user turns in one request, distinct images) of a stream."""
    turns = max((sum(m.role == "user" for m in r.messages) for r in stream), default=0)
    images = len({img.digest for r in stream for img in r.images})
    return len(stream), turns, images


def _verifier(engine: EngineProtocol, verify: Mapping[str, float] | None) -> Verifier:
    overrides: dict[str, Any] = dict(verify or {})
    return Verifier(engine, options=dataclasses.replace(_OPTIONS, **overrides))


def detect_in_corpus(
    engine: EngineProtocol, verify: Mapping[str, float] | None = None
) -> list[tuple[str, str]]:
    """Run every scenario of the plugin's corpus as the suite does; return the failures.
    ``verify`` sets ``VerifyOptions`` fields (opt-in checks such as ``min_speedup``)."""
    failed: list[tuple[str, str]] = []
    verifier = _verifier(engine, verify)
    for path in corpus_files():
        stream, meta = load_stream(path)
        try:
            steps = verifier.run(stream)
            verifier.expect_same_render(steps, meta.get("expect_same_prompt", ()))
            verifier.expect_same_render(steps, meta.get("expect_extends", ()), extends=True)
        except VerificationFailure as exc:
            failed.append((path.stem, exc.check))
    return failed


def detect(
    engine: EngineProtocol,
    *,
    name: str = "",
    examples: int = 20,
    seed_value: int = 0,
    shrink: bool = True,
    verify: Mapping[str, float] | None = None,
) -> Detection:
    """Run ``examples`` generated streams through every check of ``engine``."""
    found = Detection(name, None, None)
    verifier = _verifier(engine, verify)
    phases = (Phase.explicit, Phase.generate, Phase.shrink) if shrink else (Phase.generate,)
    start = time.perf_counter()

    configured = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=phases,
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )

    names = traits_of(engine).adapters  # the engine's adapters on: streams carry them
    adapters: dict[str, Any] = {"adapters": tuple(names)} if names else {}

    @seed(seed_value)
    @configured
    @given(stream=request_streams(closed_loop=CLOSED_LOOP_SHARE, **adapters))
    def run(stream: tuple[Request, ...]) -> None:
        _attempt(found, start, lambda: verifier.run(stream))

    if declares_restart(engine):  # restarts on (--prefixcache-restarts)
        changes = restart_changes(engine)
        restarts = restart_streams(changes=changes, closed_loop=CLOSED_LOOP_SHARE, **adapters)

        @seed(seed_value)
        @configured
        @given(stream=restarts)
        def run(stream: tuple[Request | Restart, ...]) -> None:
            _attempt(found, start, lambda: run_restart_stream(verifier, stream))

    # an engine that serves requests concurrently gets the waves too (as test_waves does)
    k = min(8, max_concurrency(engine))
    waves = request_waves(max_size=k) if k > 1 else None

    @seed(seed_value)
    @configured
    @given(waves=waves if waves is not None else request_waves())
    def run_waves(waves: tuple[Wave, ...]) -> None:
        _attempt(found, start, lambda: verifier.run_waves(waves))

    for prop in (run, run_waves) if waves is not None else (run,):
        if found.check is not None:
            break
        try:
            prop()
        except VerificationFailure as exc:
            _found(found, exc)
        except HypothesisException as exc:  # e.g. a flaky failure (a race) that did not replay
            found.detected = found.check is not None
            found.headline = f"{type(exc).__name__}: {exc}".splitlines()[0]
    found.total_seconds = time.perf_counter() - start
    return found


def _attempt(found: Detection, start: float, run: Any) -> None:
    """Run one example; remember the first failure's check and time, and the latest
    (smallest so far) failing stream, in case a race does not fail again on replay."""
    if found.check is None:
        found.examples += 1
    try:
        run()
    except VerificationFailure as exc:
        if found.check is None:
            found.check = exc.check
            found.seconds = time.perf_counter() - start
        found.stream = tuple(exc.stream)  # type: ignore[arg-type]
        found.meta = dict(exc.meta)
        found.size = stream_size(found.stream)
        raise


def _found(found: Detection, exc: VerificationFailure) -> None:
    found.detected = True
    found.shrunk_check = exc.check
    found.stream = tuple(exc.stream)  # type: ignore[arg-type]
    found.meta = dict(exc.meta)
    found.size = stream_size(found.stream)
    found.headline = str(exc).strip().splitlines()[0] if str(exc).strip() else ""


def detection_table(
    names: Iterable[str] | None = None,
    *,
    examples: int = 20,
    seed_value: int = 0,
    shrink: bool = True,
    reference: bool = True,
    model: LoadedModel | None = None,
) -> list[Detection]:
    """Detect every mutant in ``names`` (default: all), each on its fixture (``model``, when
    given, for all), then run the unmodified engine on each fixture used."""
    from pytest_prefixcache.package_data import fixture_model

    loaded: dict[str, LoadedModel] = {}

    def on(fixture: str) -> LoadedModel:
        if model is not None:
            return model
        if fixture not in loaded:
            loaded[fixture] = load_model(fixture_model(fixture))
        return loaded[fixture]

    rows: list[Detection] = []
    todo: list[tuple[str, Mutant | None, str]] = [
        (n, MUTANTS[n], MUTANTS[n].model) for n in (names or MUTANTS)
    ]
    if reference:
        fixtures = dict.fromkeys(f for _, _, f in todo) if model is None else {"": None}
        for fixture in fixtures:
            todo.append((REFERENCE + (f" [{fixture}]" if len(fixtures) > 1 else ""), None, fixture))
    merged = {k: v for _, m, _ in todo if m is not None for k, v in m.verify.items()}
    for name, mutant, fixture in todo:
        engine = Engine(on(fixture)) if mutant is None else mutant.build(on(fixture))
        if mutant is not None and mutant.switch is not None:
            engine = SwitchingKV(engine, mutant.switch)  # type: ignore[assignment]
        # the unmodified engine runs with every opt-in check the mutants need
        verify = mutant.verify if mutant is not None else merged
        row = detect(
            engine,
            name=name,
            examples=examples,
            seed_value=seed_value,
            shrink=shrink,
            verify=verify,
        )
        row.corpus = detect_in_corpus(engine, verify)
        row.scenarios = len(corpus_files())
        if mutant is not None:
            row.bug_class, row.expected = mutant.bug_class, mutant.expected_check
        rows.append(row)
    return rows


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def format_table(rows: Sequence[Detection]) -> list[str]:
    """The table as Markdown lines."""
    out = [
        "| mutant | class | expected check | detected | corpus scenarios failed | generated: "
        "caught by | examples | s to 1st failure | shrunk (requests, turns, images) | total s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.expected is None:
            verdict = "FALSE POSITIVE" if r.detected or r.corpus else "passes"
        elif r.expected not in PROTOCOL_CHECKS and not (r.detected or r.corpus):
            verdict = "no (not observable yet)"
        elif r.detected or r.corpus:
            verdict = "yes" if r.as_expected else "OTHER CHECK"
            verdict += "" if r.detected else " (corpus only)"
        else:
            verdict = "NO"
        checks = sorted({c for _, c in r.corpus})
        scenarios = f"{len(r.corpus)}/{r.scenarios} ({', '.join(checks)})" if r.corpus else "-"
        caught = r.check or "-"
        if r.shrunk_check and r.shrunk_check != r.check:
            caught += f" (shrunk: {r.shrunk_check})"
        size = "-" if r.size is None else ", ".join(map(str, r.size))
        out.append(
            f"| {r.name} | {r.bug_class or '-'} | {r.expected or '-'} | {verdict} | {scenarios} "
            f"| {caught} "
            f"| {r.examples} | {_fmt_s(r.seconds)} | {size} | {r.total_seconds:.1f} |"
        )
    return out
