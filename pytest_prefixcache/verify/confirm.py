"""A wave failure that rests on a guessed attribution is confirmed one request at a time.

Under concurrency, the logit tap ties each reply to the rows its model computed. Where the
server's scheduler named each row's request (``Outcome.attribution == "id"``) that is a fact;
for an unknown server it is inferred among the requests in flight (``"guessed"``), and a wrong
guess reads exactly like a wrong batch row. Before such a failure may FAIL, the engine's cache
is emptied (:meth:`Engine.reset`: a fresh server where the server has no reset endpoint) and the
stream through the failing wave is replayed one request at a time (nothing in flight, so nothing
is guessed); the failing request's replay is judged against the same cold reply. When the
replay fails too, the failure stands, saying so; when it does not, the wave's failure is not
proven: it is recorded as :data:`INCONCLUSIVE` with the reason (the verdict reads
INCONCLUSIVE, not PASS), and the wave goes on.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from ..checks import Problem, compare, reuse_problems
from ..checks.oracle import Match
from ..output.report import INCONCLUSIVE
from ..tap.tracks import INFERRED_COUNT
from ..types import Outcome
from .request_count import request_count_problems
from .view import VerifierView
from .wave_messages import WaveContext, wave_context

__all__ = ["INCONCLUSIVE", "confirm_count", "confirm_guessed"]


def confirm_guessed(
    verifier: VerifierView,
    ctx: WaveContext,
    i: int,
    cached: Outcome,
    alone: Outcome,
    match: Match | None,
    problems: Sequence[Problem],
) -> list[Problem]:
    """The problems the wave's request ``i`` may fail with: ``problems`` as they are when its
    attribution was not guessed (or there are none); else, after a sequential replay, those
    problems with the replay's confirmation, or none (the failure recorded as inconclusive)."""
    __tracebackhide__ = True
    if not problems or cached.attribution != "guessed":
        return list(problems)
    engine = verifier.engine
    index = ctx.first + i
    where = wave_context(ctx, i)
    verifier._call("reset() before the sequential replay", engine.reset, where)
    replayed: Outcome | None = None
    for k, request in enumerate(ctx.stream):  # the whole wave: the cache holds it after
        what = f"run(request {k}, use_cache=True) in the sequential replay"
        out = verifier._call(what, functools.partial(engine.run, request, use_cache=True), where)
        if k == index:
            replayed = out if isinstance(out, Outcome) else None
    assert replayed is not None
    again = compare(replayed, alone, verifier.options.tolerance).problems
    again += reuse_problems(replayed, match)
    how = replayed.attribution or "not observed"
    if again:
        note = (
            f"confirmed one request at a time: the stream up to request {index} replayed "
            f"sequentially on an emptied cache (attribution {how}) fails too: "
            f"{again[0].headline}"
        )
        return [Problem(p.check, p.headline, (*p.details, note), p.position) for p in problems]
    first = problems[0]
    verifier.report.add_finding(
        INCONCLUSIVE,
        f"wave {ctx.number}, request {index}: {first.check}: {first.headline}; the tap guessed "
        "which rows were this request's among the requests in flight, and the stream replayed "
        f"one request at a time on an emptied cache (attribution {how}) does not fail: the "
        "failure may be the guess's, not the engine's",
    )
    return []


def confirm_count(
    verifier: VerifierView, ctx: WaveContext, problems: Sequence[Problem]
) -> list[Problem]:
    """The request-count faults a wave may fail with (:mod:`.request_count`): as they are when
    the tap counted the prefills by the scheduler's labels; when it inferred some of them among
    the requests in flight (:data:`~pytest_prefixcache.tap.tracks.INFERRED_COUNT`), the cache
    is emptied and the stream through the wave replayed one request at a time, cached and
    cold (nothing in flight, nothing inferred): a count that is wrong again stands, saying
    so; one that fits is recorded as :data:`INCONCLUSIVE` (a wrong guess of which rows
    continue which request reads exactly like a prefill too many)."""
    __tracebackhide__ = True
    if not any(INFERRED_COUNT in p.headline for p in problems):
        return list(problems)
    engine = verifier.engine
    where = wave_context(ctx, 0)
    verifier._call("reset() before the sequential replay", engine.reset, where)
    for k, request in enumerate(ctx.stream):
        for use_cache in (True, False):  # either server may have miscounted
            what = f"run(request {k}, use_cache={use_cache}) in the sequential replay"
            run = functools.partial(engine.run, request, use_cache=use_cache)
            verifier._call(what, run, where)
    again = request_count_problems(verifier, where)
    if again:
        note = (
            "confirmed one request at a time: the stream replayed sequentially on an emptied "
            f"cache counts wrong too: {again[0].headline}"
        )
        return [Problem(p.check, p.headline, (*p.details, note), p.position) for p in problems]
    verifier.report.add_finding(
        INCONCLUSIVE,
        f"wave {ctx.number}: {problems[0].headline}; the stream replayed one request at a time "
        "on an emptied cache counts one prefill per request: the count may be the guess's, not "
        "the engine's",
    )
    return []
