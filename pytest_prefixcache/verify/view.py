"""What the verifier's helper modules use of it: :class:`VerifierView`.

The helpers (:mod:`.concurrent`, :mod:`.confirm`, :mod:`.request_count`, :mod:`.stream_checks`,
:mod:`.wave_messages`) are called by :class:`.verifier.Verifier` with itself; they type it by
this protocol, so that none of them imports the verifier (which imports them): the verify
package has no import circle, not even one only the type checker follows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NoReturn, Protocol

from .. import errors
from ..checks import Problem, ReuseOracle
from ..output.report import Report
from ..types import Engine, Request
from .efficiency import StreamEfficiency
from .messages import Context
from .options import VerifyOptions
from .worker import EngineWorker

__all__ = ["VerifierView"]


class VerifierView(Protocol):
    """The attributes and methods of :class:`.verifier.Verifier` its helpers use."""

    engine: Engine
    options: VerifyOptions
    report: Report
    stream: list[Request]
    oracle: ReuseOracle
    dead: errors.VerificationFailure | None
    on_step: Callable[[Report, int], None] | None
    failing_examples: int
    wave_workers: list[EngineWorker]
    _seconds: float
    _efficiency: StreamEfficiency

    def failure(
        self,
        problem: Problem,
        ctx: Context,
        others: Sequence[Problem] = (),
        meta: dict[str, object] | None = None,
    ) -> errors.VerificationFailure: ...

    def fail(
        self,
        problem: Problem,
        ctx: Context,
        others: Sequence[Problem] = (),
        meta: dict[str, object] | None = None,
    ) -> NoReturn: ...

    def _call(self, what: str, fn: Callable[[], object], ctx: Context) -> object: ...

    def reset(self) -> None: ...
