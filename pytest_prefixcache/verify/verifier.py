"""Driving an engine through a request stream and every check.

For each request in stream order the verifier runs ``engine.run(request, use_cache=True)``
then ``engine.run(request, use_cache=False)``, each under the timeout, and checks, in order:
faults (an uncached run that reports reuse is one), the memory budget, the pair's agreement,
the baseline audit on a fresh instance (:mod:`.audit`), then shapes (merges), equivalence,
the reuse bound against the token oracle, the positive control against the reference the
engine's design declares (``CacheDesign``), and render stability; it counts which checks
could run (the coverage). Efficiency-tier findings (render hygiene; a control that only the
token oracle would fire, :data:`FINDINGS`) are recorded, not failed; render hygiene fails
with ``strict_render``. In a closed-loop stream, a request's reply markers are filled with
the earlier cached runs' reply text first (:mod:`.closed_loop`), and a request whose cached
run reused past ``Match.decode_start`` (KV an earlier decode computed) is compared under the
decode rule (:func:`.closed_loop.tolerance_for`). The first problem found becomes a
:class:`~pytest_prefixcache.errors.VerificationFailure` whose message names the request, the
positions, the values and the replay command.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from .. import errors
from ..checks import (
    CacheDesign,
    Match,
    Problem,
    Rendered,
    ReuseOracle,
    Tolerance,
    baseline_problems,
    claim_problems,
    claims_counts,
    compare,
    coverage_of,
    expectation_problems,
    fault_problems,
    merge_problems,
    pair_problems,
    prompt_logprob_problems,
    render_problems,
    reuse_problems,
    usage_problems,
)
from ..checks.coverage import APPLIED, attribution_of
from ..checks.isolation import ISOLATION, isolation_problems, isolation_row
from ..checks.restart import STALE, stale_problems
from ..output.report import Report, RequestRecord
from ..output.streams import stream_id
from ..traits import optional_method, traits_of
from ..types import Engine, Outcome, Request, ShortRepr, Wave
from .audit import Audit
from .closed_loop import (
    CLOSED_LOOP,
    NO_TEXT,
    decode_atol_of,
    fill_replies,
    judged_line,
    rule_name,
    tolerance_for,
)
from .concurrent import WaveStep, run_waves
from .decode_kv import decoded_tokens
from .efficiency import FINDINGS, StreamEfficiency, triage
from .messages import Context, format_failure
from .options import Step, VerifyOptions
from .request_count import request_count_problems
from .stream_checks import finish_stream
from .worker import CallTimedOut, EngineWorker

__all__ = [
    "FINDINGS",
    "Step",
    "Verifier",
    "VerifyOptions",
]


@dataclass(repr=False)
class Verifier(ShortRepr):
    """Runs request streams through an engine and the checks; adds what it saw to a Report."""

    engine: Engine
    worker: EngineWorker = field(default_factory=EngineWorker)
    options: VerifyOptions = field(default_factory=VerifyOptions)
    report: Report = field(default_factory=Report)
    stream: list[Request] = field(default_factory=list)
    oracle: ReuseOracle = field(default_factory=ReuseOracle)
    dead: errors.VerificationFailure | None = None
    """The timeout failure, once an engine call hung; every later call raises it again."""
    on_step: Callable[[Report, int], None] | None = None
    """Called before each request with the report and the failing examples seen so far."""
    failing_examples: int = 0
    audit: Audit = field(default_factory=Audit)
    """A fresh instance recomputes a sample of uncached requests (the baseline audit)."""
    wave_workers: list[EngineWorker] = field(default_factory=list)
    """One long-lived worker per request in flight in a wave (the waves property)."""
    lane_workers: list[EngineWorker] = field(default_factory=list)
    """One long-lived worker per stream run in parallel (:mod:`.parallel`)."""
    counts_requests: bool = True
    """Ask the engine after each request whether its model ran one prefill per request
    (:mod:`.request_count`); off in parallel lanes, whose group asks once all are in."""
    changed_since: str | None = None
    """What the last restart with something changed changed (:mod:`.restarts`): the requests
    since then are judged for ``stale identity``."""
    _rendered: list[Rendered] = field(default_factory=list)
    _replies: list[str | None] = field(default_factory=list)
    """The text of each cached run's reply so far (what closed-loop markers are filled with)."""
    _seconds: float = 0.0
    _efficiency: StreamEfficiency = field(default_factory=StreamEfficiency)
    """What this stream's cache saved so far (:mod:`.efficiency`)."""

    def __post_init__(self) -> None:
        design = self.options.design or CacheDesign.of(self.engine)
        self.oracle.design = design
        self.report.reference, self.report.block_size = design.reference, design.block_size
        if self.decode_atol and not self.report.decode_rule:
            self.report.decode_rule = f"atol {self.decode_atol:g} ({rule_name(self.engine)})"

    def __repr__(self) -> str:
        return f"<Verifier engine={type(self.engine).__name__} stream={len(self.stream)} requests>"

    def replay_path(self, stream: Sequence[Request]) -> str:
        return str(self.options.failures_dir / stream_id(stream) / "stream.json")

    def failure(
        self,
        problem: Problem,
        ctx: Context,
        others: Sequence[Problem] = (),
        meta: dict[str, object] | None = None,
    ) -> errors.VerificationFailure:
        """The exception for ``problem``, with the full message and the replay command; its
        moment is the report's first failure when none came before (a timeout's: as it fired)."""
        self.failing_examples += 1
        self.mark_failure(problem.check)
        stream = tuple(ctx.stream)
        path = self.replay_path(stream)
        ctx = Context(stream, ctx.index, ctx.cached, ctx.match, self.options.replay_command(path))
        cls = errors.failure_class(problem.check)
        return cls(
            format_failure(problem, ctx, others),
            stream=stream,
            request_index=ctx.index,
            replay_path=path,
            meta=meta,
        )

    def mark_failure(self, check: str) -> None:
        """A failure of ``check`` happens now (:meth:`.ReportData.mark_failure`)."""
        self.report.mark_failure(check, time.monotonic() - self.options.started)

    def fail(
        self,
        problem: Problem,
        ctx: Context,
        others: Sequence[Problem] = (),
        meta: dict[str, object] | None = None,
    ) -> NoReturn:
        __tracebackhide__ = True
        raise self.failure(problem, ctx, others, meta)

    def _call(self, what: str, fn: Callable[[], object], ctx: Context) -> object:
        __tracebackhide__ = True
        if self.dead is not None:
            raise self.dead.with_traceback(None)
        try:
            res = self.worker.call(fn, timeout=self.options.timeout, what=what)
        except CallTimedOut as exc:
            head = f"{exc}; the engine is treated as dead and the remaining checks are skipped"
            self.dead = self.failure(Problem("timeout", head), ctx)
            raise self.dead from None
        if res.error is not None:
            tb = res.traceback.rstrip().splitlines()[-8:]
            name = type(res.error).__name__
            self.fail(Problem("fault", f"{what} raised {name}: {res.error}", tuple(tb)), ctx)
        self._seconds = res.seconds
        self.report.slowest_call = max(self.report.slowest_call, res.seconds)
        return res.value

    def reset(self) -> None:
        """Reset the engine's cache and forget the stream (call before each example)."""
        __tracebackhide__ = True
        self._call("engine.reset()", self.engine.reset, Context(tuple(self.stream)))
        self.stream.clear()
        self.oracle.reset()
        warmup = optional_method(self.engine, "warmup_prompts")  # the server's own, by the tap
        if warmup is not None:
            self.oracle.add_warmup(warmup())
        self._rendered.clear()
        self._replies.clear()
        self._efficiency.reset()
        self.audit.reset()
        self.changed_since = None
        self.report.streams += 1

    def step(self, request: Request) -> Step:
        """Run one request (cached, then uncached) after the stream so far, and check it."""
        __tracebackhide__ = True
        if not isinstance(request, Request):
            raise errors.RequestError(f"expected a Request, got {type(request).__name__}")
        if self.on_step is not None:
            self.on_step(self.report, self.failing_examples)
        index = len(self.stream)
        prev = self.stream[-1] if self.stream else None
        request, filled, unfilled = fill_replies(request, self._replies)
        if filled or unfilled:
            self.report.count(CLOSED_LOOP, "applied" if not unfilled else NO_TEXT)
        self.stream.append(request)
        ctx = Context(tuple(self.stream), index)
        run = self.engine.run
        cached = self._call(
            f"run(request {index}, use_cache=True)",
            functools.partial(run, request, use_cache=True),
            ctx,
        )
        self._check(fault_problems(cached, request), ctx, "cached run: ")
        assert isinstance(cached, Outcome)
        self._replies.append(cached.text)
        warm = self._seconds
        usage = optional_method(self.engine, "cache_usage")
        if usage is not None:
            self._check(usage_problems(self._call("cache_usage()", usage, ctx)), ctx)
        ctx = Context(ctx.stream, index, cached)
        uncached = self._call(
            f"run(request {index}, use_cache=False)",
            functools.partial(run, request, use_cache=False),
            ctx,
        )
        cold = self._seconds  # before the audit's calls set it again
        self._check(fault_problems(uncached, request), ctx, "uncached run: ")
        assert isinstance(uncached, Outcome)
        skewed = traits_of(self.engine).uncached_times_skewed
        self._efficiency.add_times(self.report, cached, uncached, warm, cold, skewed)
        self._check(baseline_problems(uncached), ctx, "uncached run: ")
        self._check(pair_problems(cached, uncached), ctx)
        if self.counts_requests:  # nothing in flight: both replies are in
            self._check(request_count_problems(self, ctx), ctx)
        match = None
        crossing: tuple[int, str | None] = (0, None)
        render: list[Problem] = []
        if cached.token_ids is not None:
            ids = tuple(cached.token_ids)
            render = self._findings(render_problems(request, ids, self._rendered), index)
            self._rendered.append((index, request, ids))
            spans = cached.image_spans or ()
            match = self.oracle.match(request.scope, cached.token_ids, spans)
            crossing = self.oracle.elsewhere(request.scope, cached.token_ids, spans)
            self.report.count(ISOLATION, isolation_row(match, crossing))
            starts = cached.message_starts
            self.oracle.add(  # the KV of every token it decoded, the claims' extra steps too
                index, request.scope, cached.token_ids, spans, starts, decoded_tokens(cached)
            )
            self.report.starts_unknown += starts is None
        ctx = Context(ctx.stream, index, cached, match)
        self._account(cached, uncached, match)
        tolerance = self.tolerance_for(cached, match)
        comparison = compare(cached, uncached, tolerance)
        if tolerance is not self.options.tolerance:
            self.report.decode_rule_requests += 1
            comparison.problems[:1] = [
                dataclasses.replace(
                    p, details=(*p.details, judged_line(self.engine, self.decode_atol, match))
                )
                for p in comparison.problems[:1]
            ]
        for check, outcome in coverage_of(
            request, cached, uncached, has_usage=callable(usage), compared=comparison.steps,
            prompt_logprobs=traits_of(self.engine).returns_prompt_logprobs,
        ):  # fmt: skip
            self.report.count(check, outcome)
        self._check(
            self.audit.check(
                index, request, cached, uncached, comparison, tol=tolerance,
                call=lambda what, fn: self._call(what, fn, ctx), report=self.report,
            ),
            ctx,
        )  # fmt: skip
        self.report.add_diff(comparison.worst_diff, f"request {index}")
        self.report.worst_kl = max(self.report.worst_kl, comparison.worst_kl)
        self.report.add_record(
            RequestRecord(
                self.report.streams, index, cached.prompt_tokens, cached.cached_tokens,
                None if match is None else match.max_reuse, comparison.worst_diff,
                comparison.worst_kl, warm, cold, len(request.images),
                snapshot=None if match is None else match.snapshot,
                block=None if match is None else match.block,
                bound=None if match is None else match.limit,
                warm_first_token=cached.first_token_seconds,
                cold_first_token=uncached.first_token_seconds,
                attribution=attribution_of(cached, uncached),
            )
        )  # fmt: skip
        if self.changed_since is not None:
            self.report.count(
                STALE, APPLIED if cached.cached_tokens is not None else "no cached_tokens"
            )
        self._check(
            stale_problems(cached, match, self.changed_since)
            + isolation_problems(cached, match, crossing, request.scope)
            + merge_problems(cached)
            + merge_problems(uncached)
            + comparison.problems
            + prompt_logprob_problems(cached, uncached, tolerance)
            + reuse_problems(cached, match)
            + self._findings(self._control(request, prev, cached, match), index)
            + render,
            ctx,
        )
        for side, said in (("cached run: ", cached), ("uncached run: ", uncached)):
            figures, aligned = claims_counts(said)
            self.report.claims_checked += figures
            self.report.steps_aligned += aligned
            self._check(claim_problems(said), ctx, side)
        return Step(request, cached, uncached, match, comparison)

    def _control(
        self, request: Request, prev: Request | None, cached: Outcome, match: Match | None
    ) -> list[Problem]:
        """The positive control, with the engine's ``cache_capacity_tokens`` (if declared)."""
        capacity = traits_of(self.engine).cache_capacity_tokens
        return self._efficiency.control(request, prev, cached, match, capacity)

    @property
    def decode_atol(self) -> float:
        """The decode rule's atol (:func:`.closed_loop.decode_atol_of`)."""
        return decode_atol_of(self.engine, self.options.decode_atol)

    def tolerance_for(self, cached: Outcome, match: Match | None) -> Tolerance:
        """This request's tolerance (:func:`.closed_loop.tolerance_for`)."""
        return tolerance_for(self.options.tolerance, self.decode_atol, cached, match)

    def _findings(self, problems: list[Problem], index: int) -> list[Problem]:
        """The problems that fail (:func:`.efficiency.triage`)."""
        return triage(problems, index, self.report, strict_render=self.options.strict_render)

    def _account(self, cached: Outcome, uncached: Outcome, match: Match | None) -> None:
        r = self.report
        r.requests += 1
        r.merges_checked += len(cached.merges or ()) + len(uncached.merges or ())
        if cached.cached_tokens:
            r.cache_hits += 1
        self._efficiency.add_reuse(r, cached, match)

    def _check(self, problems: list[Problem], ctx: Context, prefix: str = "") -> None:
        __tracebackhide__ = True
        if problems:
            first = problems[0]
            if prefix:
                first = Problem(first.check, prefix + first.headline, first.details, first.position)
            self.fail(first, ctx, problems[1:])

    def finish(self) -> None:
        """Stream-level checks after the last request: ``--prefixcache-min-efficiency`` and
        ``--prefixcache-min-speedup`` (:mod:`.stream_checks`)."""
        __tracebackhide__ = True
        finish_stream(self)

    def expect_same_render(
        self, steps: Sequence[Step], pairs: Sequence[Sequence[int]], *, extends: bool = False
    ) -> None:
        """Scenario expectations (see :mod:`pytest_prefixcache.checks.render`): request j renders
        to the same prompt as request i, or with ``extends`` keeps all of it."""
        __tracebackhide__ = True
        outcomes = [(s.cached, s.match) for s in steps]
        for j, problem, meta in expectation_problems(outcomes, pairs, extends=extends):
            if not self._findings([problem], j):
                continue
            ctx = Context(tuple(self.stream[: j + 1]), j, steps[j].cached, steps[j].match)
            self.fail(problem, ctx, meta=meta)

    def run_waves(self, waves: Sequence[Wave], *, reset: bool = True) -> list[WaveStep]:
        """Reset (by default), then serve each wave concurrently and check every request
        against the same request served alone, cold (see :mod:`.concurrent`)."""
        __tracebackhide__ = True
        return run_waves(self, waves, reset=reset)

    def run(self, stream: Sequence[Request], *, reset: bool = True) -> list[Step]:
        """Reset (by default), run every request of ``stream`` and the stream-level checks."""
        __tracebackhide__ = True
        if reset:
            self.reset()
        steps = [self.step(r) for r in stream]
        self.finish()
        return steps
