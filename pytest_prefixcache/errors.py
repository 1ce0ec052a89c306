"""The exception hierarchy: one root, and input errors that name what was wrong."""

from __future__ import annotations

__all__ = [
    "BaselineFailure",
    "ClaimsFailure",
    "EfficiencyFailure",
    "EngineError",
    "EngineFault",
    "EngineTimeout",
    "EquivalenceFailure",
    "ImageError",
    "MemoryBudgetFailure",
    "PositiveControlFailure",
    "PrefixCacheError",
    "PromptLogprobsFailure",
    "RenderHygieneFailure",
    "RenderStabilityFailure",
    "RequestError",
    "ReuseBoundFailure",
    "ShapeFailure",
    "SpeedupFailure",
    "StaleIdentityFailure",
    "VerificationFailure",
    "failure_class",
]


class PrefixCacheError(Exception):
    """Root of every error pytest-prefixcache raises on purpose."""


class ImageError(PrefixCacheError, ValueError):
    """An image could not be decoded or is outside the supported limits."""


class RequestError(PrefixCacheError, ValueError):
    """A Message or Request was built from invalid parts."""


class EngineError(PrefixCacheError):
    """An engine could not be loaded, or returned something outside the protocol."""


class VerificationFailure(PrefixCacheError, AssertionError):
    """The engine's cache broke a check; the message reads like a bug report.

    Attributes:
        check: the name of the check that failed (``"equivalence"``, ``"shapes"``, ...).
        stream: the request stream up to and including the failing request.
        request_index: the failing request's index in ``stream`` (None for stream-level checks).
        replay_path: where the stream is (or will be) saved for ``--prefixcache-replay``.
        meta: extra keys saved with the stream (a scenario's expectations).
    """

    check = "verification"

    def __init__(
        self,
        message: str,
        *,
        stream: tuple[object, ...] = (),
        request_index: int | None = None,
        replay_path: str | None = None,
        meta: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.stream = stream
        self.request_index = request_index
        self.replay_path = replay_path
        self.meta = dict(meta or {})

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class EquivalenceFailure(VerificationFailure):
    """A cached outcome differs from the uncached one beyond the tolerance."""

    check = "equivalence"


class ShapeFailure(VerificationFailure):
    """A vision merge filled a different number of placeholder slots than embedding rows."""

    check = "shapes"


class ReuseBoundFailure(VerificationFailure):
    """``cached_tokens`` exceeds the longest prefix that could validly be reused."""

    check = "reuse bound"


class StaleIdentityFailure(VerificationFailure):
    """After a restart with something changed, the engine reused a prefix cached before it."""

    check = "stale identity"


class PromptLogprobsFailure(VerificationFailure):
    """A cache hit's prompt logprobs differ from the cold run's (vLLM's ``prompt_logprobs``)."""

    check = "prompt logprobs"


class PositiveControlFailure(VerificationFailure):
    """An identical repeat or an append-only next turn reused nothing."""

    check = "positive control"


class EfficiencyFailure(VerificationFailure):
    """Total reuse fell below ``--prefixcache-min-efficiency`` of the oracle's maximum."""

    check = "min efficiency"


class EngineFault(VerificationFailure):
    """An engine call raised, or returned NaN, a wrong shape or dtype, or inconsistent counts."""

    check = "fault"


class EngineTimeout(EngineFault):
    """An engine call did not answer within ``--prefixcache-timeout`` seconds."""

    check = "timeout"


class RenderStabilityFailure(VerificationFailure):
    """An identical request rendered to other tokens, or an append-only turn re-rendered the
    history, so a prefix cache cannot reuse it."""

    check = "render stability"


class RenderHygieneFailure(VerificationFailure):
    """A next turn re-rendered the history, or requests that differ only in volatile bytes
    rendered differently (an efficiency finding; a failure with --prefixcache-strict-render)."""

    check = "render hygiene"


class SpeedupFailure(VerificationFailure):
    """Requests served from the cache were not faster than ``--prefixcache-min-speedup``."""

    check = "min speedup"


class BaselineFailure(VerificationFailure):
    """The uncached baseline is not cold: a fresh instance of the engine computes another
    answer for the same request."""

    check = "cold baseline"


class MemoryBudgetFailure(VerificationFailure):
    """The engine's reported cache memory breaks its budget or counts entries as 0 bytes."""

    check = "memory budget"


class ClaimsFailure(VerificationFailure):
    """What the engine claimed (a reuse figure from its API, stats, metrics, log or headers; a
    decode step's logprobs) differs from what its model computed (the logit tap)."""

    check = "claims"


def failure_class(check: str) -> type[VerificationFailure]:
    """The VerificationFailure subclass for a check name (the base class for unknown ones)."""
    todo = list(VerificationFailure.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls.check == check:
            return cls
        todo.extend(cls.__subclasses__())
    return VerificationFailure
