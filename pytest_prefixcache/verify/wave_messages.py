"""How a wave's failures read: what the runner knows about the wave being checked (its
requests, arrivals and the order the engine served them), the wave's line in every failure,
and a request that raised while others were in flight, told like a bug report (the error's
first line, what every request in flight got, the server's log)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from ..checks import Problem
from ..checks.oracle import Match
from ..errors import EngineError
from ..types import Outcome, Request, Wave
from .messages import Context
from .view import VerifierView
from .worker import CallResult, Job

__all__ = [
    "WaveContext",
    "check_wave",
    "fail_wave",
    "in_flight_lines",
    "raised_problem",
    "served_order",
    "wave_context",
]


@dataclass
class WaveContext:
    """What the runner knows about the wave being checked (for failure messages)."""

    number: int
    wave: Wave
    first: int
    stream: tuple[Request, ...]
    meta: dict[str, object]
    served: list[int | None] = field(default_factory=list)

    def describe(self) -> str:
        ms = ", ".join(f"{a * 1000:g}" for a in self.wave.arrivals)
        order = (
            "unknown (Outcome.served not reported)"
            if None in self.served or not self.served
            else ", ".join(str(self.first + i) for i in served_order(self.served))
        )
        last = self.first + len(self.wave) - 1
        return (
            f"wave {self.number}: requests {self.first}-{last} in flight together "
            f"(arrivals ms: {ms}); served order: {order}; each reply compared with the same "
            "request served alone, cold (use_cache=False)"
        )


def served_order(served: Sequence[int | None]) -> list[int]:
    """The wave's request indexes in the order the engine served them (``Outcome.served``)."""
    return sorted(range(len(served)), key=lambda i: (served[i] or 0, i))


def first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).partition(chr(10))[0]}"


def in_flight_lines(jobs: Sequence[Job], ctx: WaveContext, deadline: float) -> list[str]:
    """What each request of the wave got, once every one has answered (or the deadline
    passed): a request that failed is reported with the requests it was sent with."""
    lines = ["in flight together:"]
    for j, job in enumerate(jobs):
        got = "no answer yet"
        if job.done.wait(max(0.0, deadline - time.perf_counter())):
            res: CallResult = job.result
            out = res.value
            if res.error is not None:
                got = f"raised {first_line(res.error)}"
            elif isinstance(out, Outcome):
                got = f"answered: {out.prompt_tokens} prompt tokens, {out.cached_tokens} reused"
        lines.append(f"  request {ctx.first + j}: {got}")
    return lines


def raised_problem(what: str, result: CallResult, in_flight: list[str]) -> Problem:
    """A fault that reads like a bug report: the error's first line (an HTTP status and its
    body), which requests were in flight and what each got, then the rest of the error (a
    server's log) and, for an exception that is not the adapter's own words, its traceback."""
    error = result.error
    assert error is not None
    rest = str(error).splitlines()[1:]
    tb = [] if isinstance(error, EngineError) else result.traceback.rstrip().splitlines()[-8:]
    return Problem("fault", f"{what} raised {first_line(error)}", (*in_flight, *rest, *tb))


def wave_context(
    ctx: WaveContext, i: int, cached: Outcome | None = None, match: Match | None = None
) -> Context:
    return Context(ctx.stream, ctx.first + i, cached, match)


def fail_wave(
    verifier: VerifierView,
    problem: Problem,
    ctx: WaveContext,
    i: int,
    cached: Outcome | None = None,
    match: Match | None = None,
) -> NoReturn:
    __tracebackhide__ = True
    detailed = Problem(
        problem.check,
        f"wave {ctx.number}, {problem.headline}",
        (ctx.describe(), *problem.details),
        problem.position,
    )
    raise verifier.failure(detailed, wave_context(ctx, i, cached, match), meta=ctx.meta)


def check_wave(
    verifier: VerifierView,
    problems: list[Problem],
    ctx: WaveContext,
    i: int,
    prefix: str = "",
    cached: Outcome | None = None,
    match: Match | None = None,
) -> None:
    __tracebackhide__ = True
    if problems:
        first = problems[0]
        first = Problem(first.check, prefix + first.headline, first.details, first.position)
        fail_wave(verifier, first, ctx, i, cached, match)
