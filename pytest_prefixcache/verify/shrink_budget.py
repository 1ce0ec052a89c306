"""What a failing property may spend after its first failure (``--prefixcache-shrink-budget``).

After a property's first failing example Hypothesis keeps generating for a while (looking for
other bugs), then shrinks every distinct failure: its limits are 500 successful shrinks and five
minutes per test, with no bound on the calls that do not shrink. Each call is a whole request
stream through the engine (a wave's requests run three times), so a failing run used to cost
several passing ones, most of it spent shrinking (docs/benchmarks.md, "What a failing run
costs").

A :class:`ShrinkBudget` counts the examples that reach the engine after a property's first
failure. Once ``limit`` of them have run, a new example is *skipped*: rejected
(``hypothesis.reject``) before any engine call, so the shrinker moves on at no engine cost
(Hypothesis still draws each candidate), unless it is an input that already failed, which
raises that failure again (Hypothesis's final replay of the shrunk example). So a failing
property runs at most its examples up to the first failure plus ``limit`` more on the engine,
and every distinct failure it found is still reported, with the smallest stream found for it
within the budget, its saved stream and its replay line.

Inputs are compared by value (requests, waves and images are frozen dataclasses; an image by
its digest): a drawn input that equals a failed one is that failure. The state machine draws
its requests one step at a time: :meth:`ShrinkBudget.follow` lets a skipped machine example go
on without the engine, sending nothing, answered with what a failed run sent while it follows
one; it raises that run's failure again at the step where it failed, and :meth:`finish`
rejects the example at its end otherwise.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, NoReturn

from hypothesis import reject

from ..output.report import Report

__all__ = ["FINISH", "Failed", "ShrinkBudget", "limit_for"]

#: A state-machine run's last "step": the stream-level checks after its last request.
FINISH = "<the stream-level checks>"


def limit_for(share: float | None, examples: int) -> int | None:
    """The examples a property of ``examples`` examples may run after its first failure:
    ``share`` of them, rounded up (None: no bound but Hypothesis's own)."""
    return None if share is None else math.ceil(share * examples)


@dataclass(frozen=True)
class Failed:
    """An input that failed: what was drawn, what the engine was sent before the failing step
    (the state machine's bundle values), and the failure with its traceback."""

    drawn: tuple[Any, ...]
    sent: tuple[Any, ...]
    error: BaseException
    traceback: TracebackType | None

    def raise_again(self) -> NoReturn:
        __tracebackhide__ = True
        raise self.error.with_traceback(self.traceback)


@dataclass
class ShrinkBudget:
    """The budget of one property's run (one Hypothesis run: a round of ``--prefixcache-budget``
    gets a budget of its own). ``limit`` None: unbounded."""

    limit: int | None
    report: Report | None = None
    """Counts ``shrink_examples`` and ``shrink_skipped`` into it, as they happen."""
    spent: int = 0
    """Examples that reached the engine after the first failure."""
    skipped: int = 0
    """Examples rejected without an engine call: the budget was spent."""
    replayed: int = 0
    """Failed inputs drawn again once the budget was spent: their failure raised again."""
    failures: list[Failed] = field(default_factory=list)

    @property
    def exhausted(self) -> bool:
        return bool(self.failures) and self.limit is not None and self.spent >= self.limit

    def start(self) -> bool:
        """An example starts: True when it may reach the engine (counted when a failure came
        before it); False when the budget is spent."""
        if not self.failures:
            return True
        if self.exhausted:
            return False
        self.spent += 1
        if self.report is not None:
            self.report.shrink_examples += 1
        return True

    def skip(self) -> NoReturn:
        """Reject the example in hand, before any engine call."""
        self.skipped += 1
        if self.report is not None:
            self.report.shrink_skipped += 1
        reject()
        raise AssertionError("unreachable: hypothesis.reject() raises")

    def failed(self, drawn: Sequence[Any], error: BaseException, sent: Sequence[Any] = ()) -> None:
        """Remember a failing input (the first of equal ones)."""
        key = tuple(drawn)
        if all(f.drawn != key for f in self.failures):
            self.failures.append(Failed(key, tuple(sent), error, error.__traceback__))

    def run(self, drawn: Sequence[Any], test: Callable[[], object]) -> None:
        """Run ``test`` on the whole input ``drawn`` (a stream, its waves, a group of streams)
        within the budget."""
        __tracebackhide__ = True
        if not self.start():
            for f in self.failures:
                if f.drawn == tuple(drawn):
                    self.replayed += 1
                    f.raise_again()
            self.skip()
        try:
            test()
        except Exception as exc:
            self.failed(drawn, exc)
            raise

    def bounds(self, test: Callable[..., object]) -> Callable[..., None]:
        """``test``, a property of whole drawn inputs, within the budget (decorate it under
        ``@given``: the signature Hypothesis reads is ``test``'s)."""

        @functools.wraps(test)
        def bounded(*args: Any, **kwargs: Any) -> None:
            __tracebackhide__ = True
            self.run((*args, *kwargs.values()), lambda: test(*args, **kwargs))

        return bounded

    def follow(self, drawn: Sequence[Any]) -> Any:
        """A skipped state-machine example's next step, ``drawn`` its requests so far: that
        failed run's failure raised again at the step where it failed, else the request a failed
        run sent at this step (the example goes on without the engine), else None: the example
        has left every failed run (it goes on drawing, never sent, and :meth:`finish` rejects it:
        a rejection at this step would contradict an earlier run that drew on from here)."""
        __tracebackhide__ = True
        key, n = tuple(drawn), len(drawn)
        for f in self.failures:
            if f.drawn == key:
                self.replayed += 1
                f.raise_again()
        for f in self.failures:
            if f.drawn[:n] == key and n <= len(f.sent):
                return f.sent[n - 1]
        return None

    def finish(self, drawn: Sequence[Any]) -> None:
        """The end of a skipped state-machine example: the stream-level failure of the failed
        run it followed to its last step, raised again; else it is rejected. Nothing is raised
        while another exception unwinds (Hypothesis calls a machine's teardown then too)."""
        __tracebackhide__ = True
        if sys.exc_info()[0] is not None:
            return
        key = (*drawn, FINISH)
        for f in self.failures:
            if f.drawn == key:
                self.replayed += 1
                f.raise_again()
        self.skip()
