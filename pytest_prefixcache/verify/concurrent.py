"""The waves property: concurrent cached requests against the same requests served alone, cold.

For each wave (:class:`~pytest_prefixcache.types.Wave`) the verifier

1. sends every request with ``use_cache=True`` from its own thread, each at its arrival offset,
   all in flight together (the engine declares ``max_concurrency``);
2. serves each request alone with ``use_cache=False``, one after the other: the reference;
3. sends the wave again with ``use_cache=False``, concurrently: the noise control, which
   tells a batching fault from a cache fault (:mod:`.wave_judge`): a cold reply in the wave
   that differs from the same request alone is a batching fault on an engine that declares
   ``batch_invariant = True``, else batch non-invariance (the finding :data:`BATCH_NOISE`,
   the cached replies of that wave then judged within :data:`NOISE_FACTOR` times the
   measured noise); a cached reply that differs where the cold wave did not is a cache fault;
4. checks each request as the stream path does: faults, the cold baseline, the pair's
   agreement, shapes (merges), equivalence at every step, the first token's and each decode
   step's (first and worst position, both values; counted in the coverage row
   ``wave decode steps``, compared / generated), the
   reuse bound, judged in the order the engine served the wave (``Outcome.served``; when the
   engine does not say, against every other request of the wave, since any order was
   possible), and the engine's claims against what its model computed (the logit tap); a
   failure that rests on the tap's guess of which rows were a request's is confirmed by a
   sequential replay first, else recorded as inconclusive (:mod:`.confirm`);
5. asks an engine that counts them (``request_count_problems()``: the HTTP adapter with the
   tap) whether its servers ran as many prefills as they were sent requests.

A failure names the wave, its arrivals and served order, and saves the waves (their
structure under the stream file's ``"waves"`` key, see :mod:`..output.streams`) for
``--prefixcache-replay``; Hypothesis shrinks it to the smallest wave that still fails.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..checks import (
    Problem,
    ReuseOracle,
    baseline_problems,
    claim_problems,
    claims_counts,
    compare,
    fault_problems,
    merge_problems,
    pair_problems,
    reuse_problems,
    usage_problems,
)
from ..checks.baseline import CHECK as COLD_BASELINE
from ..checks.coverage import APPLIED, NOT_SAMPLED, coverage_of
from ..checks.equivalence import Comparison
from ..checks.oracle import Match
from ..output.streams import waves_to_json
from ..traits import optional_method, traits_of
from ..types import Outcome, Request, Wave
from .confirm import confirm_count, confirm_guessed
from .decode_kv import decoded_tokens
from .request_count import REQUEST_COUNT, request_count_problems
from .view import VerifierView
from .wave_judge import (
    BATCH_NOISE,
    NOISE_FACTOR,
    Noise,
    batch_invariant,
    batching_problems,
    decode_coverage,
    judge,
    measure_noise,
)
from .wave_messages import (
    WaveContext,
    check_wave,
    fail_wave,
    in_flight_lines,
    raised_problem,
    served_order,
    wave_context,
)
from .worker import CallResult, EngineWorker

__all__ = [
    "BATCH_NOISE",
    "CONCURRENT",
    "NOISE_FACTOR",
    "REQUEST_COUNT",
    "WaveStep",
    "max_concurrency",
    "run_waves",
]

#: The coverage row of the requests served in waves.
CONCURRENT = "concurrent"
#: Cold waves sent at most, when a cached reply differs and the cold wave did not.
NOISE_WAVES = 3
NO_ORDER = "no served order (judged against every other request of the wave)"


def max_concurrency(engine: object) -> int:
    """The engine's declared ``max_concurrency`` (1 when absent or not an int above 0)."""
    n = traits_of(engine).max_concurrency
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


@dataclass(frozen=True)
class WaveStep:
    """One request of a wave: its cached (concurrent), alone (cold) and noise (cold,
    concurrent) outcomes, the oracle's match and the comparison with the alone run."""

    request: Request
    cached: Outcome
    alone: Outcome
    noise: Outcome
    match: Match | None
    comparison: Comparison


def _fire(
    verifier: VerifierView, wave: Wave, *, use_cache: bool, ctx: WaveContext
) -> list[Outcome]:
    """Send the wave's requests from their own workers at their arrival offsets; wait for
    every reply (the timeout counts from the last arrival)."""
    __tracebackhide__ = True
    workers = _workers(verifier, len(wave))
    start = time.perf_counter() + 0.002  # every worker is handed its job before the first send
    jobs = []
    for worker, request, at in zip(workers, wave.requests, wave.arrivals):

        def send(request: Request = request, at: float = at) -> object:
            time.sleep(max(0.0, start + at - time.perf_counter()))
            return verifier.engine.run(request, use_cache=use_cache)

        jobs.append(worker.submit(send))
    deadline = time.perf_counter() + max(wave.arrivals) + verifier.options.timeout
    outcomes: list[Outcome] = []
    for i, job in enumerate(jobs):
        what = f"run(request {ctx.first + i}, use_cache={use_cache}) in wave {ctx.number}"
        if not job.done.wait(max(0.0, deadline - time.perf_counter())):
            for w in workers:
                w.dead = f"{what} hung"
            head = (
                f"{what} did not answer within {verifier.options.timeout:g} s of the last "
                "arrival; the engine is treated as dead and the remaining checks are skipped"
            )
            verifier.dead = verifier.failure(
                Problem("timeout", head, (ctx.describe(),)), wave_context(ctx, i), meta=ctx.meta
            )
            raise verifier.dead from None
        result: CallResult = job.result
        if result.error is not None:
            fail_wave(
                verifier, raised_problem(what, result, in_flight_lines(jobs, ctx, deadline)), ctx, i
            )
        side = "cached run" if use_cache else "cold run in a wave"
        check_wave(verifier, fault_problems(result.value, wave.requests[i]), ctx, i, f"{side}: ")
        assert isinstance(result.value, Outcome)
        outcomes.append(result.value)
    waited = time.perf_counter() - (deadline - verifier.options.timeout)  # from the last arrival
    verifier.report.slowest_call = max(verifier.report.slowest_call, waited)
    return outcomes


def _workers(verifier: VerifierView, n: int) -> list[EngineWorker]:
    """Long-lived daemon workers, one per request in flight (a thread that ran MLX work and
    ended can abort the interpreter at exit, see :meth:`EngineWorker.close`)."""
    pool = verifier.wave_workers
    while len(pool) < n:
        pool.append(EngineWorker(f"prefixcache-wave-{len(pool)}"))
    return pool[:n]


def _matches(
    oracle: ReuseOracle, first: int, wave: Wave, cached: Sequence[Outcome]
) -> list[Match | None]:
    """The oracle's answer for each request, in the engine's served order when every reply
    names it, else against every other request of the wave too; adds the wave to ``oracle``."""
    served = [o.served for o in cached]
    matches: list[Match | None] = [None] * len(wave)
    known = None not in served
    if not known:
        for i, (req, o) in enumerate(zip(wave.requests, cached)):
            if o.token_ids is None:
                continue
            others = oracle.copy()
            for j, (r2, o2) in enumerate(zip(wave.requests, cached)):
                if j != i and o2.token_ids is not None:
                    others.add(first + j, r2.scope, o2.token_ids, o2.image_spans or ())
            matches[i] = others.match(req.scope, o.token_ids, o.image_spans or ())
    for i in served_order(served):
        req, o = wave.requests[i], cached[i]
        if o.token_ids is None:
            continue
        spans = o.image_spans or ()
        if known:
            matches[i] = oracle.match(req.scope, o.token_ids, spans)
        # the KV of every token it decoded: a later request may continue its reply
        oracle.add(first + i, req.scope, o.token_ids, spans, o.message_starts, decoded_tokens(o))
    return matches


#: Rows of the stream path's coverage that the waves do not run (each is counted there).
NOT_IN_WAVES = frozenset({"positive control", "render stability"})


def _count(
    verifier: VerifierView,
    request: Request,
    cached: Outcome,
    alone: Outcome,
    comparison: Comparison,
) -> None:
    """Count one wave request: in the report's requests, the coverage rows of the checks
    it ran (the fresh-instance audit samples the streams' requests, not the waves'), and
    its decode steps compared."""
    report = verifier.report
    compared = comparison.steps
    report.requests += 1
    report.cache_hits += bool(cached.cached_tokens)
    report.merges_checked += len(cached.merges or ()) + len(alone.merges or ())
    usage = optional_method(verifier.engine, "cache_usage") is not None
    for check, outcome in coverage_of(request, cached, alone, has_usage=usage, compared=compared):
        if check not in NOT_IN_WAVES:
            report.count(check, outcome)
    report.count(COLD_BASELINE, NOT_SAMPLED)
    report.count(CONCURRENT, APPLIED if cached.served is not None else NO_ORDER)
    for row, outcome, n in decode_coverage(cached, alone, comparison):
        report.count(row, outcome, n)


def run_waves(
    verifier: VerifierView, waves: Sequence[Wave], *, reset: bool = True
) -> list[WaveStep]:
    """Reset (by default), then serve and check each wave in turn (see the module docstring)."""
    __tracebackhide__ = True
    if reset:
        verifier.reset()
    steps: list[WaveStep] = []
    stream: list[Request] = []
    for number, wave in enumerate(waves):
        if not isinstance(wave, Wave):
            raise TypeError(f"expected a Wave, got {type(wave).__name__}")
        first = len(stream)
        stream.extend(wave.requests)
        verifier.stream.extend(wave.requests)
        meta: dict[str, object] = {"waves": waves_to_json(waves[: number + 1])}
        ctx = WaveContext(number, wave, first, tuple(stream), meta)
        steps.extend(_serve(verifier, wave, ctx))
    return steps


def _serve(verifier: VerifierView, wave: Wave, ctx: WaveContext) -> list[WaveStep]:
    __tracebackhide__ = True
    if verifier.on_step is not None:
        verifier.on_step(verifier.report, verifier.failing_examples)
    tol = verifier.options.tolerance
    cached = _fire(verifier, wave, use_cache=True, ctx=ctx)
    ctx.served = [o.served for o in cached]
    usage = optional_method(verifier.engine, "cache_usage")
    if usage is not None:
        value = verifier._call("cache_usage()", usage, wave_context(ctx, 0))
        check_wave(verifier, usage_problems(value), ctx, 0)
    alone = []
    run = verifier.engine.run
    for i, request in enumerate(wave.requests):
        what = f"run(request {ctx.first + i}, use_cache=False) alone"
        call = functools.partial(run, request, use_cache=False)
        out = verifier._call(what, call, wave_context(ctx, i))
        check_wave(verifier, fault_problems(out, request), ctx, i, "uncached run alone: ")
        assert isinstance(out, Outcome)
        check_wave(verifier, baseline_problems(out), ctx, i, "uncached run alone: ")
        alone.append(out)
    measured = Noise((), ())
    for _ in range(NOISE_WAVES):
        noise = _fire(verifier, wave, use_cache=False, ctx=ctx)
        for i, out in enumerate(noise):
            check_wave(verifier, baseline_problems(out), ctx, i, "cold run in a wave: ")
        measured = measure_noise(tol, alone, noise)
        # batches are made by timing: when a cached reply differs and this cold wave did not,
        # send the cold wave again before calling it a cache bug
        if measured.worst or all(not compare(c, a, tol).problems for c, a in zip(cached, alone)):
            break
    batching = batching_problems(measured)
    if batching is not None and batch_invariant(verifier.engine):
        check_wave(verifier, batching[1], ctx, batching[0])
    if batching is not None:
        verifier.report.add_finding(
            BATCH_NOISE,
            f"wave of {len(wave)} requests {ctx.first}-{ctx.first + len(wave) - 1}: cache-off "
            f"replies in the wave differ from the same requests alone by up to "
            f"{measured.worst:.3g}",
        )
    matches = _matches(verifier.oracle, ctx.first, wave, cached)
    serial = traits_of(verifier.engine).cold_waves_serial
    steps = []
    for i, request in enumerate(wave.requests):
        c, a, m = cached[i], alone[i], matches[i]
        check_wave(verifier, pair_problems(c, a), ctx, i, cached=c, match=m)
        comparison, differs = judge(tol, measured, i, c, a, serial)
        problems = merge_problems(c) + merge_problems(a) + differs
        problems = confirm_guessed(verifier, ctx, i, c, a, m, problems + reuse_problems(c, m))
        check_wave(verifier, problems, ctx, i, cached=c, match=m)
        for side, said in (("cached run: ", c), ("uncached run alone: ", a)):
            figures, aligned = claims_counts(said)
            verifier.report.claims_checked += figures
            verifier.report.steps_aligned += aligned
            check_wave(verifier, claim_problems(said), ctx, i, side, cached=c, match=m)
        _count(verifier, request, c, a, comparison)
        verifier.report.add_diff(comparison.worst_diff, f"request {ctx.first + i} (wave)")
        steps.append(WaveStep(request, c, a, noise[i], m, comparison))
    # every reply of the wave is in: nothing in flight
    counted = request_count_problems(verifier, wave_context(ctx, 0))
    for problem in confirm_count(verifier, ctx, counted):  # an inferred count: replayed first
        fail_wave(verifier, problem, ctx, len(wave) - 1)
    return steps
