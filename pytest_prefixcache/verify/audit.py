"""The baseline audit: a fresh instance of the engine recomputes a sample of uncached requests.

See :mod:`pytest_prefixcache.checks.baseline` for why. The sample, where bugs hide first:

- the first request of each stream (what survives a reset);
- every request whose images come back in another order than in an earlier request of the
  stream (the same images in another order, or shared images reordered): a feature cache
  keyed by the set of images, not their order, shows only there;
- the first ``REPLACED_PER_STREAM`` requests whose image list replaces images of an earlier
  one (the same length, other images);
- the first ``REPEATED_PER_STREAM`` requests that repeat an earlier image list exactly (a
  repeat or a re-encoding): its own budget, so a plain repeat never uses up the sample of
  the reorders and replacements that follow it;
- every request whose cached and uncached runs disagree.

A next turn that only adds images is not sampled. The caps keep the default run's cost in
bounds (``benchmarks/verify_throughput.py --audit-cost``). The coverage row counts audited
requests against all of them: the others are "not in the audit's sample", which is not a gap.

Each audited request gets a new engine object, so nothing an earlier request left behind can
leak into it; unless the engine declares ``fresh_instance_share = N`` (a server that takes
15-40 s to start): then one fresh instance answers up to N audited requests that share
nothing it could carry from one to the next (up to ``HELD`` instances are kept at once, and a
request goes to the first one it shares nothing with; :func:`shares_nothing`: no image, and
first messages that part within a few words, :data:`SHARED_OPENING`). A separate namespace
would not do: the caches the audit exists to catch may ignore namespaces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..checks import Comparison, Problem, Tolerance, fault_problems, fresh_problems, fresh_verdict
from ..checks.baseline import CHECK
from ..checks.coverage import APPLIED, NOT_SAMPLED
from ..errors import EngineError
from ..output.report import Report
from ..traits import optional_method, traits_of
from ..types import Engine, Message, Outcome, Request

__all__ = [
    "HELD",
    "REPEATED_PER_STREAM",
    "REPLACED_PER_STREAM",
    "SHARED_OPENING",
    "Audit",
    "fresh_share",
    "rearrangement",
    "shares_nothing",
]


#: Requests that replace an earlier request's images audited per stream (the first ones).
REPLACED_PER_STREAM = 2
#: Requests that repeat an earlier request's image list exactly, audited per stream.
REPEATED_PER_STREAM = 1
#: Fresh instances kept at once for their share (``fresh_instance_share`` > 1): a request
#: goes to the first one it shares nothing with.
HELD = 4


def rearrangement(images: tuple[str, ...], before: tuple[str, ...]) -> str | None:
    """How ``images`` rearrange the images of an earlier request: ``"reordered"`` (shared
    images in another order), ``"replaced"`` (as many images, other ones), ``"repeated"``
    (the same list again), or None (no images, or only images added)."""
    if not images:
        return None
    shared = [d for d in images if d in before]
    if shared != [d for d in before if d in images]:
        return "reordered"
    if images == before:
        return "repeated"
    if len(images) == len(before):
        return "replaced"
    return None


#: Characters two first messages may have in common, from their start, and still count as
#: sharing nothing: a few words (both system prompts of the strategies open with "You ").
SHARED_OPENING = 16


def _opening(message: Message) -> str:
    """A message's content as the text its prompt carries (an image as its digest)."""
    return "".join(p if isinstance(p, str) else f"<image {p.digest}>" for p in message.content)


def shares_nothing(request: Request, earlier: Request) -> bool:
    """True when a fresh instance that answered ``earlier`` (uncached) can carry nothing into
    ``request`` that would change its answer: no image in common, and first messages that part
    within their first :data:`SHARED_OPENING` characters (another role, or content that differs
    there), so the two prompts share nothing beyond the chat template's opening and a few
    words."""
    if {i.digest for i in request.images} & {i.digest for i in earlier.images}:
        return False
    first, other = request.messages[0], earlier.messages[0]
    if first.role != other.role:
        return True
    a, b = _opening(first), _opening(other)
    if a == b:  # the prompts go on together into the template's next turn
        return False
    parted = (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    common = next(parted, min(len(a), len(b)))
    return common < SHARED_OPENING


def fresh_share(engine: object) -> int:
    """The engine's ``fresh_instance_share`` (audited requests one fresh instance may answer;
    default 1), checked: an int >= 1."""
    n = traits_of(engine).fresh_instance_share
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise EngineError(
            f"{type(engine).__name__}.fresh_instance_share = {n!r}: must be an int >= 1 (how "
            "many audited requests one fresh instance may answer)"
        )
    return n


Call = Callable[[str, Callable[[], object]], object]
"""Runs an engine call on the verifier's worker under its timeout: (what, fn) -> result."""


@dataclass
class Audit:
    """Which requests a fresh instance recomputes, and how."""

    fresh: Callable[[], Engine] | None = None
    """Builds a fresh instance of the engine (None: the baseline cannot be audited)."""
    missing: str = "engine given as an instance"
    """Why there is no ``fresh`` (the coverage table shows it)."""
    share: int = 1
    """Audited requests one fresh instance may answer (:func:`shares_nothing` between them)."""
    built: int = 0
    """Fresh instances built so far."""
    _earlier: list[tuple[str, ...]] = field(default_factory=list)
    _spent: dict[str, int] = field(default_factory=dict)
    _held: list[tuple[object, list[Request]]] = field(default_factory=list)
    """Fresh instances kept for their share: each with the requests it answered."""

    def reset(self) -> None:
        """A new stream begins."""
        self._earlier.clear()
        self._spent.clear()

    def _sampled(self, index: int, request: Request) -> bool:
        images = tuple(img.digest for img in request.images)
        kinds = {rearrangement(images, before) for before in self._earlier}
        if images:
            self._earlier.append(images)
        if index == 0 or "reordered" in kinds:
            return True
        caps = (("replaced", REPLACED_PER_STREAM), ("repeated", REPEATED_PER_STREAM))
        for kind, cap in caps:
            if kind in kinds and self._spent.get(kind, 0) < cap:
                self._spent[kind] = self._spent.get(kind, 0) + 1
                return True
        return False

    def check(
        self,
        index: int,
        request: Request,
        cached: Outcome,
        uncached: Outcome,
        comparison: Comparison,
        *,
        tol: Tolerance,
        call: Call,
        report: Report,
    ) -> list[Problem]:
        """Audit the request if it is in the sample; the problems of the fresh run, or of the
        baseline against it. An equivalence problem gets a line saying which side the fresh
        instance agrees with."""
        sampled = self._sampled(index, request)
        if self.fresh is None:
            report.count(CHECK, self.missing)
            return []
        if not (sampled or comparison.problems):
            report.count(CHECK, NOT_SAMPLED)
            return []
        engine, served = self._instance(request, call)
        run = engine.run  # type: ignore[attr-defined]
        try:
            fresh = call(
                f"a fresh instance's run(request {index}, use_cache=False)",
                lambda: run(request, use_cache=False),
            )
        finally:  # a fresh server, say, is stopped as soon as it has answered its share
            served.append(request)
            if len(served) >= self.share:
                self._close(engine)
        faults = fault_problems(fresh, request)
        if faults:
            return [replace(p, headline="fresh instance: " + p.headline) for p in faults]
        assert isinstance(fresh, Outcome)
        report.count(CHECK, APPLIED)
        problems = fresh_problems(cached, uncached, fresh, tol)
        if comparison.problems and not problems:
            first = comparison.problems[0]
            line = fresh_verdict(cached, fresh, tol)
            comparison.problems[0] = replace(first, details=(*first.details, line))
        return problems

    def _instance(self, request: Request, call: Call) -> tuple[object, list[Request]]:
        """A held fresh instance none of whose requests shares anything with ``request``,
        else a new one (the oldest held one stopped when ``HELD`` are kept)."""
        for held in self._held:
            if all(shares_nothing(request, r) for r in held[1]):
                return held
        if len(self._held) >= HELD:
            self._close(self._held[0][0])
        assert self.fresh is not None
        engine = call("building a fresh instance of the engine", self.fresh)
        self.built += 1
        self._held.append((engine, []))
        return self._held[-1]

    def _close(self, engine: object) -> None:
        self._held = [h for h in self._held if h[0] is not engine]
        close = optional_method(engine, "close")
        if callable(close):
            close()

    def close(self) -> None:
        """Stop every held fresh instance (when the session ends)."""
        while self._held:
            self._close(self._held[0][0])
