"""Parallel streams (``--prefixcache-parallel-streams``): independent streams verified at once,
each in its own namespace, with the sequential path's checks and verdict.

Negative controls: mutants of the zoo are still caught when the streams run in parallel, and
a failure found in parallel is saved with its lanes and replays (in parallel) to the same
failure, while the unmodified engine passes the same replay.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import HypothesisException

from pytest_prefixcache import Message, Request
from pytest_prefixcache.errors import PrefixCacheError, VerificationFailure
from pytest_prefixcache.output.streams import load_stream, save_stream
from pytest_prefixcache.strategies import CLOSED_LOOP_SHARE, request_streams
from pytest_prefixcache.suite.verification import _groups
from pytest_prefixcache.verify.audit import Audit
from pytest_prefixcache.verify.parallel import (
    SHARED_CAPACITY,
    lanes_for,
    parallel_from,
    parallel_to_json,
    run_parallel,
    separate,
)
from pytest_prefixcache.verify.verifier import Verifier

mx = pytest.importorskip("mlx.core")

from reference_engine import Engine  # noqa: E402
from reference_engine.mutants import MUTANTS, SMALL_BUDGET  # noqa: E402

pytest_plugins = ["pytester"]

SYSTEM = "You are a careful assistant. Answer every question precisely and briefly. " * 2


def _req(text: str, ns: str = "", new: int = 1) -> Request:
    return Request((Message("system", (SYSTEM,)), Message("user", (text,))), ns, new)


class _Engine:
    def __init__(self, k: object = 4, namespaces: bool = True) -> None:
        self.max_concurrency = k
        self.supports_namespaces = namespaces


def test_lanes_for_needs_concurrent_service_and_namespaces() -> None:
    assert lanes_for(_Engine(4), 4) == (4, "")
    assert lanes_for(_Engine(4), 1) == (1, "")
    assert lanes_for(_Engine(2), 4) == (2, "the engine declares max_concurrency = 2")
    assert lanes_for(_Engine(1), 4)[0] == 1
    assert lanes_for(_Engine(True), 4)[0] == 1  # a bool is no declaration
    assert lanes_for(_Engine(4, namespaces=False), 4) == (
        1,
        "the engine has no namespaces to keep parallel streams apart",
    )


def test_separate_gives_each_lane_namespaces_of_its_own() -> None:
    a = (_req("a"), _req("b", "tenant-b"))
    lanes = separate([a, a, a])
    assert [r.namespace for r in lanes[0]] == ["", "tenant-b"]  # lane 0 as drawn
    assert [r.namespace for r in lanes[1]] == ["lane1", "lane1-tenant-b"]
    assert [r.namespace for r in lanes[2]] == ["lane2", "lane2-tenant-b"]
    assert len({r.namespace for lane in lanes for r in lane}) == 6
    assert [r.messages for r in lanes[2]] == [r.messages for r in a]


def test_parallel_file_entry_round_trips_and_names_a_bad_field() -> None:
    stream = tuple(_req(str(i)) for i in range(5))
    entry = parallel_to_json([3, 2])
    assert entry == [[0, 1, 2], [3, 4]]
    lanes = parallel_from(stream, {"parallel": entry})
    assert lanes == (stream[:3], stream[3:])
    assert parallel_from(stream, {}) is None
    for bad, field in (
        ([], "parallel"),
        ([[0, 1], []], "parallel[1]"),
        ([[0, 1], [1]], "parallel[1][0]"),
        ([[0, 9]], "parallel[0][1]"),
        ([[2, 1]], "parallel[0][1]"),
        ([[True]], "parallel[0][0]"),
    ):
        with pytest.raises(PrefixCacheError, match="^" + re.escape(field)):
            parallel_from(stream, {"parallel": bad})


def _streams(n: int, seed_value: int) -> list[tuple[Request, ...]]:
    out: list[tuple[Request, ...]] = []

    @seed(seed_value)
    @settings(max_examples=n, phases=(Phase.generate,), database=None, deadline=None)
    @given(stream=request_streams(closed_loop=CLOSED_LOOP_SHARE, max_requests=5))
    def collect(stream: tuple[Request, ...]) -> None:
        out.append(stream)

    collect()
    return out[:n]


def _verifier(engine: Any, audit: Audit | None = None) -> Verifier:
    return Verifier(engine, audit=audit or Audit(None, "not audited here"))


@pytest.mark.slow
def test_parallel_streams_run_every_check_of_the_sequential_path(model: Any) -> None:
    """The same streams, one at a time and four at once: both pass, with the same requests,
    hits and coverage row for row (the audit included); the lanes really overlap."""
    streams = _streams(8, seed_value=3)
    fresh = Audit(lambda: Engine(model), share=1)
    one = _verifier(Engine(model), Audit(fresh.fresh, share=1))
    for s in streams:
        one.run(s)
    par = _verifier(Engine(model), Audit(fresh.fresh, share=1))
    engine = par.engine
    inflight, most = [0], [0]
    run = engine.run

    def counting(request: Request, *, use_cache: bool) -> Any:
        inflight[0] += 1
        most[0] = max(most[0], inflight[0])
        try:
            return run(request, use_cache=use_cache)
        finally:
            inflight[0] -= 1

    engine.run = counting  # type: ignore[method-assign]
    for i in range(0, len(streams), 4):
        steps = run_parallel(par, separate(streams[i : i + 4]))
        assert [len(s) for s in steps] == [len(s) for s in streams[i : i + 4]]
    a, b = one.report, par.report
    assert (
        (b.requests, b.streams)
        == (a.requests, a.streams)
        == (
            sum(len(s) for s in streams),
            len(streams),
        )
    )
    assert b.cache_hits == a.cache_hits
    assert b.coverage == a.coverage
    assert b.coverage["cold baseline"].get("applied", 0) > 0
    assert b.worst_diff == a.worst_diff == 0.0
    assert most[0] > 1, "the lanes never had two requests in flight"


def _detect_parallel(engine: Any, examples: int, seed_value: int = 0) -> VerificationFailure:
    verifier = _verifier(engine)
    found: list[VerificationFailure] = []

    @seed(seed_value)
    @settings(
        max_examples=examples,
        phases=(Phase.generate,),
        database=None,
        deadline=None,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(group=_groups(request_streams(closed_loop=CLOSED_LOOP_SHARE), 4))
    def prop(group: tuple[tuple[Request, ...], ...]) -> None:
        try:
            run_parallel(verifier, group)
        except VerificationFailure as exc:
            found.append(exc)
            raise

    # a race that does not fail again when Hypothesis replays it ends as a FlakyFailure (as
    # in the detection table): the failure seen is what counts
    with pytest.raises((VerificationFailure, HypothesisException)):
        prop()
    assert found, "no example failed"
    return found[0]


#: Mutants run with parallel streams, and the check each must fail: the namespace leak
#: (another lane's blocks are another namespace's), two races among requests in flight
#: (lanes are in flight together), and key, image and snapshot bugs of the sequential path.
#: ``read_before_write`` is not here: lanes share no block (each has its own namespaces),
#: so only the waves property (which runs alongside, unchanged) can catch it.
CAUGHT = {
    "namespace_missing": "reuse bound",
    "wrong_batch_row": "equivalence",
    "evict_in_use": "equivalence",
    "never_stores": "positive control",
    "placeholder_collision": "equivalence",
    "image_order_ignored": "equivalence",
    "unchained_blocks": "equivalence",
    "snapshot_before_prefill": "equivalence",
}


#: Races show when the timing lets them happen: more examples (as the detection table's),
#: and more seeds until one shows. Measured (tests/ alone, two runs at once): evict_in_use
#: fails 2 to 5 of 30 examples a seed, and 0 in one CI run on a loaded machine; three seeds
#: of 30 make a miss unlikely while a caught race costs what one seed does.
RACES = {"wrong_batch_row": 30, "evict_in_use": 30}
RACE_SEEDS = 3


def _detect_race(engine: Any, examples: int) -> VerificationFailure:
    """The first failure over up to ``RACE_SEEDS`` seeds of ``examples`` each."""
    for seed_value in range(RACE_SEEDS - 1):
        try:
            return _detect_parallel(engine, examples, seed_value)
        except pytest.fail.Exception:  # this seed's timing never let the race happen
            engine.reset()
    return _detect_parallel(engine, examples, RACE_SEEDS - 1)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CAUGHT))
def test_mutants_are_caught_with_parallel_streams(models: Any, name: str) -> None:
    mutant = MUTANTS[name]
    engine = mutant.build(models(mutant.model))
    if name in RACES:
        exc = _detect_race(engine, RACES[name])
    else:
        exc = _detect_parallel(engine, examples=12)
    assert exc.check == CAUGHT[name], str(exc)


@pytest.mark.slow
def test_a_positive_control_missed_in_parallel_is_judged_by_the_stream_alone(model: Any) -> None:
    """A small cache shared by four lanes: other lanes' entries evict a lane's, and a repeat
    reuses nothing. The unmodified engine passes the stream alone, so that is a finding, not
    a failure (never_stores, which fails alone too, is caught: see CAUGHT)."""
    verifier = _verifier(Engine(model, max_bytes=SMALL_BUDGET))

    @seed(0)
    @settings(max_examples=12, phases=(Phase.generate,), database=None, deadline=None)
    @given(group=_groups(request_streams(closed_loop=CLOSED_LOOP_SHARE), 4))
    def prop(group: tuple[tuple[Request, ...], ...]) -> None:
        run_parallel(verifier, group)

    prop()
    assert verifier.report.findings.get(SHARED_CAPACITY, 0) > 0
    line = next(x for x in verifier.report.finding_examples if x.startswith(SHARED_CAPACITY))
    assert "the stream alone passes" in line


@pytest.mark.slow
def test_the_unmodified_engine_passes_the_same_parallel_run(model: Any) -> None:
    verifier = _verifier(Engine(model))

    @seed(0)
    @settings(max_examples=6, phases=(Phase.generate,), database=None, deadline=None)
    @given(group=_groups(request_streams(closed_loop=CLOSED_LOOP_SHARE), 4))
    def prop(group: tuple[tuple[Request, ...], ...]) -> None:
        run_parallel(verifier, group)

    prop()
    assert verifier.report.requests > 0


def _cross_lane_leak() -> list[tuple[Request, ...]]:
    """Two lanes that send the same conversation: lane 1 (namespace ``lane1``) may reuse
    nothing lane 0 stored."""
    conv = "Tell me about prefix caches and why their keys must include the namespace. " * 2
    return [
        (_req(conv), _req(conv)),
        (_req("Something else entirely. " + conv), _req(conv)),
    ]


@pytest.mark.slow
def test_a_failure_found_in_parallel_is_saved_with_its_lanes_and_replays(
    model: Any, tmp_path: Path
) -> None:
    leaky = MUTANTS["namespace_missing"]
    with pytest.raises(VerificationFailure) as info:
        for _ in range(3):  # the lanes' timing decides who stores first: some run leaks
            run_parallel(_verifier(leaky.build(model)), separate(_cross_lane_leak()))
    exc = info.value
    assert exc.check == "reuse bound"
    assert "streams ran in parallel, each in its own namespace" in str(exc)
    assert "--prefixcache-replay=" in str(exc)
    lanes = exc.meta["parallel"]
    assert isinstance(lanes, list) and len(lanes) == 2
    path = save_stream(exc.stream, tmp_path / "failure", check=exc.check, **exc.meta)  # type: ignore[arg-type]
    assert json.loads(path.read_text())["parallel"] == lanes
    stream, meta = load_stream(path)
    saved = parallel_from(stream, meta)
    assert saved is not None and {r.namespace for r in saved[1]} == {"lane1"}
    for _ in range(3):  # replayed in parallel: the same failure
        with pytest.raises(VerificationFailure) as again:
            run_parallel(_verifier(leaky.build(model)), saved)
        assert again.value.check == "reuse bound"
        assert again.value.meta["parallel"]
    steps = run_parallel(_verifier(Engine(model)), saved)  # the fixed engine passes it
    assert sum(len(s) for s in steps) == len(stream)


LEAKY = """from reference_engine.mutants import MUTANTS

engine = MUTANTS["namespace_missing"].factory
"""


@pytest.mark.slow
def test_the_suite_with_parallel_streams_catches_shrinks_and_replays(
    pytester: pytest.Pytester,
) -> None:
    """End to end: ``--prefixcache-parallel-streams=4`` on the namespace leak fails the
    reuse bound, Hypothesis shrinks the group, and the saved stream replays to the same
    failure (in parallel when it kept more than one lane); the unmodified engine passes it."""
    pytester.makepyfile(leaky=LEAKY)
    common = ["-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-seed=1"]
    result = pytester.runpytest_subprocess(
        *common, "--prefixcache-engine=leaky:engine", "--prefixcache-examples=8",
        "--prefixcache-parallel-streams=4", "--prefixcache-report=r.json",
        "--prefixcache-failures-dir=fails", "-k", "request_streams",
    )  # fmt: skip
    assert result.ret == 1, result.stdout.str()[-3000:]
    assert "--prefixcache-parallel-streams=4" in result.stdout.str()  # the header's seed line
    report = json.loads((pytester.path / "r.json").read_text())
    assert {f["check"] for f in report["failures"]} == {"reuse bound"}
    saved = sorted((pytester.path / "fails").glob("*/stream.json"))
    assert saved
    for path in saved:
        replay = [*common, f"--prefixcache-replay={path}", "--prefixcache-allow-partial"]
        again = pytester.runpytest_subprocess(*replay, "--prefixcache-engine=leaky:engine")
        assert again.ret == 1, again.stdout.str()[-3000:]
        assert "reuse bound" in again.stdout.str()
        fixed = pytester.runpytest_subprocess(
            *replay, "--prefixcache-engine=reference_engine:default_engine"
        )
        assert fixed.ret == 0, fixed.stdout.str()[-3000:]


def test_the_reproduce_line_names_the_parallel_streams() -> None:
    """A seed draws groups of streams with the option, single streams without: the summary's
    reproduce line repeats it, and the report keeps it through JSON and xdist merges."""
    from pytest_prefixcache.output.report import Report

    report = Report(seed=7, parallel_streams=4)
    assert "reproduce with --prefixcache-seed=7 --prefixcache-parallel-streams=4" in report.lines()
    assert Report(seed=7).lines().count("reproduce with --prefixcache-seed=7") == 1
    again = Report.from_json(report.to_json())
    assert again.parallel_streams == 4
    merged = Report(seed=7)
    merged.merge(again, worker="gw0")
    assert merged.parallel_streams == 4


def test_the_request_count_is_asked_once_every_lane_stopped(model: Any) -> None:
    """Lanes never ask while others are in flight (a prefill of another lane's request would
    count against theirs); the group asks once, after all of them, and fails on a mismatch."""
    from pytest_prefixcache import EngineFault

    engine = Engine(model)
    asked: list[int] = []
    problems: list[str] = []

    def count() -> list[str]:
        asked.append(len(inflight))
        return list(problems)

    inflight: list[Request] = []
    run = engine.run

    def tracking(request: Request, *, use_cache: bool) -> Any:
        inflight.append(request)
        try:
            return run(request, use_cache=use_cache)
        finally:
            inflight.remove(request)

    engine.run = tracking  # type: ignore[method-assign]
    engine.request_count_problems = count  # type: ignore[attr-defined]
    streams = separate([(_req("Hello."), _req("Hello.")), (_req("Goodbye."),)])
    run_parallel(_verifier(engine), streams)
    assert asked == [0]  # once, with nothing in flight
    problems.append("http://127.0.0.1:1 answered 3 request(s) but its model ran 4 prefill(s)")
    with pytest.raises(EngineFault) as info:
        run_parallel(_verifier(engine), streams)
    text = str(info.value)
    assert "request count: http://127.0.0.1:1 answered 3" in text
    assert "once the 2 streams run in parallel had all stopped" in text
    one = _verifier(engine)  # the sequential path asks after each request
    with pytest.raises(EngineFault, match="request count"):
        one.run(streams[0])
