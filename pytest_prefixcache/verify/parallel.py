"""Parallel streams: independent request streams verified at once, each in its own namespace.

With ``--prefixcache-parallel-streams=N`` and an engine that declares ``max_concurrency``
above 1 and namespaces, the generated-streams property draws groups of up to N streams and
runs them together: one thread per stream ("lane"), each driving its own
:class:`~.verifier.Verifier` (its own worker, reuse oracle, baseline audit, closed-loop
replies and stream-level checks) against the one engine. Every check of the sequential path
runs, on every request, as it does there; what changes is only that other streams' requests
are in flight meanwhile, in other namespaces (:func:`separate`: lane 0 keeps the namespaces
it drew, lane j's are prefixed ``laneJ``), so each lane's oracle, per namespace and in the
lane's own order (a lane sends its next request after the previous reply), is the oracle of
the sequential path. The engine is reset once per group, before any lane starts.

A positive control that fails in a lane is judged by the lane's stream alone, after the
group, on a reset engine (:func:`_confirm_alone`): the lanes share the cache, and other lanes'
entries can evict what a repeat needed. Failing alone, that failure is raised (as on the
sequential path); passing, it is the finding :data:`SHARED_CAPACITY`.

Any other failure in one lane stops the others before their next request and is raised for the
group: its message is the lane's (the lane's stream, its request index) plus a line naming
the lane, and the saved stream file holds every lane's requests sent so far, with
``"parallel": [[0, 1, 2], [3, 4]]`` (the request indexes of each lane), so
``--prefixcache-replay`` runs the same lanes in parallel again (:func:`parallel_from`).
Hypothesis shrinks a failing group like any example: fewer lanes (down to the one stream
that fails, which then runs alone, as on the sequential path), shorter streams.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..checks import Problem
from ..errors import PrefixCacheError, VerificationFailure, failure_class
from ..output.report import Report
from ..traits import traits_of
from ..types import Request
from .audit import Audit
from .concurrent import max_concurrency
from .messages import Context, format_failure
from .request_count import request_count_problems
from .verifier import Verifier
from .worker import EngineWorker

if TYPE_CHECKING:
    from .options import Step

__all__ = [
    "CONFIRMED_ALONE",
    "LANE_PREFIX",
    "SHARED_CAPACITY",
    "Lane",
    "lanes_for",
    "parallel_from",
    "parallel_to_json",
    "run_parallel",
    "separate",
]

#: The check whose failure in a lane is confirmed by the stream alone: other lanes' entries
#: share the cache, so an eviction they caused can leave a repeat with nothing to reuse.
CONFIRMED_ALONE = "positive control"
#: The finding of a positive control that failed in parallel and passed alone.
SHARED_CAPACITY = "positive control under parallel streams"

#: Lane j > 0 runs its stream in namespaces prefixed with this and j (``lane1``,
#: ``lane1-tenant-b``); lane 0 keeps the namespaces its stream drew.
LANE_PREFIX = "lane"


def lanes_for(engine: object, asked: int) -> tuple[int, str]:
    """How many lanes a run with ``--prefixcache-parallel-streams=asked`` gets on ``engine``,
    and why fewer than asked (empty when as many)."""
    if asked <= 1:
        return 1, ""
    k = max_concurrency(engine)
    if k < 2:
        return 1, "the engine declares no concurrent service (max_concurrency above 1)"
    if traits_of(engine).supports_namespaces is False:
        return 1, "the engine has no namespaces to keep parallel streams apart"
    return min(asked, k), "" if k >= asked else f"the engine declares max_concurrency = {k}"


def _lane_namespace(lane: int, namespace: str) -> str:
    if lane == 0:
        return namespace
    return f"{LANE_PREFIX}{lane}" + (f"-{namespace}" if namespace else "")


def separate(streams: Sequence[Sequence[Request]]) -> tuple[tuple[Request, ...], ...]:
    """Each stream in namespaces of its own (see :data:`LANE_PREFIX`)."""
    return tuple(
        tuple(dataclasses.replace(r, namespace=_lane_namespace(j, r.namespace)) for r in s)
        for j, s in enumerate(streams)
    )


def parallel_to_json(lengths: Sequence[int]) -> list[list[int]]:
    """The ``"parallel"`` entry of a stream file whose requests are the lanes' in order."""
    out, first = [], 0
    for n in lengths:
        out.append(list(range(first, first + n)))
        first += n
    return out


def parallel_from(
    stream: Sequence[Request], meta: dict[str, Any]
) -> tuple[tuple[Request, ...], ...] | None:
    """The lanes a loaded stream file declares under ``"parallel"`` (None when none): every
    request index in range and used once, each lane's in ascending order. Raises
    PrefixCacheError naming the field (``parallel[1][0]``)."""
    raw = meta.get("parallel")
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise PrefixCacheError(f"parallel: is {raw!r:.60}, expected a non-empty JSON array")
    seen: set[int] = set()
    lanes = []
    for j, lane in enumerate(raw):
        if not isinstance(lane, list) or not lane:
            raise PrefixCacheError(f"parallel[{j}]: is {lane!r:.60}, expected request indexes")
        for k, i in enumerate(lane):
            ok = isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(stream)
            if not ok or i in seen or (k and i < lane[k - 1]):
                why = (
                    f"not a request index from 0 to {len(stream) - 1}"
                    if not ok
                    else "used twice"
                    if i in seen
                    else "out of order"
                )
                raise PrefixCacheError(f"parallel[{j}][{k}]: {i!r} is {why}")
            seen.add(i)
        lanes.append(tuple(stream[i] for i in lane))
    return tuple(lanes)


class _Group:
    """The lanes of one group: their streams so far, the first failure, the stop signal."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.lanes: list[Lane] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.failed: BaseException | None = None

    def failure(
        self,
        lane: Lane,
        problem: Problem,
        ctx: Context,
        others: Sequence[Problem],
        meta: dict[str, object] | None,
    ) -> VerificationFailure:
        """The lane's failure, saved with every lane's requests sent so far (see the module
        docstring)."""
        self.stop.set()
        lane.mark_failure(problem.check)
        streams: list[tuple[Request, ...]] = []
        offset = 0
        for other in self.lanes:
            if other is lane:
                offset = sum(len(s) for s in streams)
            sent = tuple(ctx.stream) if other is lane else tuple(other.stream)
            if sent:
                streams.append(sent)
        group = tuple(r for s in streams for r in s)
        path = lane.replay_path(group)
        index = None if ctx.index is None else offset + ctx.index
        where = (
            f"stream {lane.number}"
            if index is None
            else f"stream {lane.number} (its request {ctx.index} is request {index} of the "
            "saved file)"
        )
        note = (
            f"{where}; {len(streams)} streams ran in parallel, each in its own namespace "
            "(--prefixcache-parallel-streams); the replay runs them in parallel again"
        )
        problem = dataclasses.replace(problem, details=(*problem.details, note))
        replay = lane.options.replay_command(path)
        shown = Context(ctx.stream, ctx.index, ctx.cached, ctx.match, replay)
        lane.failing_examples += 1
        return failure_class(problem.check)(
            format_failure(problem, shown, others),
            stream=group,
            request_index=index,
            replay_path=path,
            meta={**(meta or {}), "parallel": parallel_to_json([len(s) for s in streams])},
        )


class Lane(Verifier):
    """A lane's verifier: its failures go through its group (:meth:`_Group.failure`)."""

    number: int = 0
    group: _Group | None = None

    def failure(
        self,
        problem: Problem,
        ctx: Context,
        others: Sequence[Problem] = (),
        meta: dict[str, object] | None = None,
    ) -> VerificationFailure:
        if self.group is None or self.group.count == 1 or problem.check == CONFIRMED_ALONE:
            return super().failure(problem, ctx, others, meta)
        return self.group.failure(self, problem, ctx, others, meta)


def _workers(main: Verifier, n: int) -> list[EngineWorker]:
    """Long-lived lane workers (as the waves' ones: a thread that ran MLX work and ended can
    abort the interpreter at exit); a worker left hung by a timeout is replaced."""
    pool = main.lane_workers
    pool[:] = [w for w in pool if w.dead is None]
    while len(pool) < n:
        pool.append(EngineWorker(f"prefixcache-lane-{len(pool)}"))
    return pool[:n]


def run_parallel(main: Verifier, streams: Sequence[Sequence[Request]]) -> list[list[Step]]:
    """Reset the engine, then run each stream in its own lane, all at once, with every check
    of :meth:`Verifier.run`; the first failure (in time) is raised once every lane stopped.
    ``streams`` are already in namespaces of their own (:func:`separate`)."""
    __tracebackhide__ = True
    if len(streams) == 1:
        return [main.run(streams[0])]
    if main.on_step is not None:
        main.on_step(main.report, main.failing_examples)
    main.reset()  # one stream counted; each lane adds its own below
    main.report.streams -= 1
    group = _Group(len(streams))
    base = main.report.streams
    for j, worker in enumerate(_workers(main, len(streams))):
        audit = main.audit
        lane = Lane(
            main.engine,
            worker,
            main.options,
            Report(streams=base + j + 1),
            audit=Audit(audit.fresh, audit.missing, audit.share),
        )
        lane.number, lane.group, lane.counts_requests = j, group, False
        group.lanes.append(lane)
    results: list[list[Step]] = [[] for _ in streams]
    alone: dict[int, VerificationFailure] = {}

    def drive(j: int) -> None:
        lane = group.lanes[j]
        try:
            for request in streams[j]:
                if group.stop.is_set():
                    return
                results[j].append(lane.step(request))
            if not group.stop.is_set():
                lane.finish()
        except VerificationFailure as exc:
            if exc.check == CONFIRMED_ALONE:  # the others go on; the stream alone decides
                alone[j] = exc
                return
            group.stop.set()
            with group.lock:
                group.failed = group.failed or exc
        except BaseException as exc:
            group.stop.set()
            with group.lock:
                group.failed = group.failed or exc
        finally:
            lane.audit.close()

    threads = [
        threading.Thread(target=drive, args=(j,), name=f"prefixcache-lane-driver-{j}", daemon=True)
        for j in range(len(streams))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for j, exc in sorted(alone.items()):
        if group.failed is not None:
            break
        try:
            results[j] = _confirm_alone(main, group.lanes[j], streams[j], exc)
        except BaseException as err:
            group.failed = err
    if group.failed is None:  # every lane stopped: nothing in flight
        last = max(group.lanes, key=lambda lane: len(lane.stream))
        ctx = Context(tuple(last.stream), len(last.stream) - 1)
        for problem in request_count_problems(main, ctx)[:1]:
            note = f"counted once the {len(streams)} streams run in parallel had all stopped"
            problem = dataclasses.replace(problem, details=(*problem.details, note))
            group.failed = group.failure(last, problem, ctx, (), None)
    for lane in group.lanes:
        lane.report.streams = 1
        main.report.merge(lane.report)
        main.audit.built += lane.audit.built
        main.failing_examples += lane.failing_examples
        main.dead = main.dead or lane.dead
    if group.failed is not None:
        # its own traceback: Hypothesis tells distinct failures apart by where they were
        # raised (in the lane), as on the sequential path
        raise group.failed
    return results


def _confirm_alone(
    main: Verifier, lane: Lane, stream: Sequence[Request], exc: VerificationFailure
) -> list[Step]:
    """A lane's positive control failed: run its stream alone, after a reset, as the
    sequential path does. Failing alone, that is the failure (saved as a plain stream);
    passing, the parallel run's miss is a finding (other lanes' entries took the capacity)
    and the lane's report becomes the alone run's (every request of the stream counted)."""
    __tracebackhide__ = True
    solo = Lane(main.engine, lane.worker, main.options, Report(streams=lane.report.streams - 1))
    solo.audit = Audit(lane.audit.fresh, lane.audit.missing, lane.audit.share)
    try:
        steps = solo.run(stream)
    finally:
        solo.audit.close()
        lane.audit.built += solo.audit.built
        lane.failing_examples += solo.failing_examples
        lane.dead = lane.dead or solo.dead
    solo.report.add_finding(
        SHARED_CAPACITY,
        f"stream {lane.number}: {str(exc).splitlines()[0]} (in parallel with other streams; "
        "the stream alone passes: they shared the cache's capacity)",
    )
    lane.report = solo.report
    return steps
