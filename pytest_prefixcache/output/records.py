"""The records a report keeps: one per failure, one per request."""

from __future__ import annotations

from dataclasses import dataclass

from ..checks.oracle import over_bound

__all__ = ["FailureRecord", "FirstFailure", "RequestRecord"]


@dataclass(frozen=True)
class FailureRecord:
    """One failed test: which check, where, the first line of the message, the replay command,
    the full message and the directory holding the saved stream (its images are PNGs there)."""

    check: str
    test: str
    summary: str
    replay: str | None = None
    message: str = ""
    stream_dir: str | None = None
    request_index: int | None = None
    worker: str = ""


@dataclass(frozen=True)
class FirstFailure:
    """The moment of a session's first failure of any kind: a check's problem, a timeout as it
    fired, a test's error. ``seconds`` count from the session's start (its servers' starts
    included); ``streams`` and ``requests`` are the examples and requests run by then (a
    parallel lane's own; ``None``: a test's error, counted when its report came in)."""

    seconds: float
    check: str
    streams: int | None = None
    requests: int | None = None


@dataclass(frozen=True)
class RequestRecord:
    """One request the verifier ran (cached, then uncached)."""

    stream: int
    request: int
    prompt_tokens: int | None
    cached_tokens: int | None
    """Prompt tokens the engine reported as reused."""
    reusable: int | None
    """The token oracle's maximum valid reuse for this request (None without token ids)."""
    diff: float
    """Worst |cached - uncached| over the compared positions."""
    kl: float
    warm_seconds: float
    cold_seconds: float
    images: int
    worker: str = ""
    snapshot: int | None = None
    """The snapshot-aware reference's maximum (None without token ids, or an older report)."""
    block: int | None = None
    """Whole blocks of ``reusable``, for a block-granular design."""
    warm_first_token: float | None = None
    """The cached run's time to first token (None: not reported)."""
    cold_first_token: float | None = None
    """The uncached run's time to first token (None: not reported)."""
    attribution: str | None = None
    """How the logit tap tied the request's computed rows to its replies (``id``,
    ``sequential``, ``guessed``: the weaker of its two runs'); None without a tap."""

    bound: int | None = None
    """The correctness bound the reuse check judged by (:attr:`.Match.limit`; None: an older
    report, whose bound was ``reusable``)."""

    @property
    def over(self) -> bool:
        """The engine reported more reuse than any cache could validly reuse: the reuse bound
        failed (the reuse check's own test, :func:`.over_bound`)."""
        return over_bound(self.cached_tokens, self.reusable if self.bound is None else self.bound)
