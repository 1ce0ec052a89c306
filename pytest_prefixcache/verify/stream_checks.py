"""The stream-level checks, after a stream's last request: the efficiency floor
(``--prefixcache-min-efficiency``) on what the stream's cache saved, and the speedup floor
(``--prefixcache-min-speedup``), which fails only when replays of the stream agree (timing is
noisy)."""

from __future__ import annotations

import dataclasses
import functools

from ..checks import efficiency_problem, speedup_problem
from ..types import Outcome
from .efficiency import REMEASURES, FastestRuns
from .messages import Context
from .view import VerifierView

__all__ = ["finish_stream", "remeasure_speedup"]


def finish_stream(verifier: VerifierView) -> None:
    """Fail ``verifier``'s stream (``VerifierView.fail``) below either floor its options set."""
    __tracebackhide__ = True
    ctx = Context(tuple(verifier.stream))
    options, efficiency = verifier.options, verifier._efficiency
    floor = options.min_efficiency
    if floor is not None:
        e = efficiency
        problem = efficiency_problem(e.reused, e.reusable, floor, verifier.oracle.design)
        if problem is not None:
            verifier.fail(problem, ctx)
    speedup = options.min_speedup
    if speedup is not None:
        measure, warm, cold = efficiency.speedup_times()
        problem = speedup_problem(warm, cold, speedup, measure)
        if problem is not None:  # timing is noisy: fail only if the replays agree
            again = remeasure_speedup(verifier, measure)
            if again < speedup:
                line = f"replayed {REMEASURES} times: {again:.2f}x on each hit's fastest runs"
                verifier.fail(dataclasses.replace(problem, details=(*problem.details, line)), ctx)


def remeasure_speedup(verifier: VerifierView, measure: str) -> float:
    """Replay the stream :data:`.efficiency.REMEASURES` times, each after a reset, with no
    checks, and return the speedup of its hits' fastest runs on ``measure``
    (:class:`.efficiency.FastestRuns`)."""
    fastest = FastestRuns()
    engine, stream = verifier.engine, verifier.stream
    for _ in range(REMEASURES):
        verifier._call("engine.reset()", engine.reset, Context(tuple(stream)))
        for i, req in enumerate(stream):
            ctx = Context(tuple(stream), i)
            hit = verifier._call(
                "remeasure", functools.partial(engine.run, req, use_cache=True), ctx
            )
            t = verifier._seconds
            cold = verifier._call(
                "remeasure", functools.partial(engine.run, req, use_cache=False), ctx
            )
            if isinstance(hit, Outcome) and isinstance(cold, Outcome):
                fastest.add(i, hit, cold, t, verifier._seconds)
    return fastest.speedup(measure)
