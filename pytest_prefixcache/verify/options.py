"""The verifier's options (how strict, how to name a replay) and what one request gave."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..checks import CacheDesign, Comparison, Match, Tolerance
from ..output.streams import FAILURES_DIR
from ..types import Outcome, Request
from .worker import DEFAULT_TIMEOUT

__all__ = ["Step", "VerifyOptions", "default_replay_command"]


def default_replay_command(path: str) -> str:
    """A verifier's replay line outside a pytest session (which names its own, with the
    run's settings): this interpreter's pytest, so that the plugin is the one installed."""
    python = shlex.quote(sys.executable)
    return f"{python} -m pytest --prefixcache-verify --prefixcache-replay={shlex.quote(path)}"


@dataclass(frozen=True)
class VerifyOptions:
    """How strict the checks are and how to name the replay of a failure."""

    tolerance: Tolerance = field(default_factory=Tolerance)
    timeout: float = DEFAULT_TIMEOUT
    min_efficiency: float | None = None
    min_speedup: float | None = None
    strict_render: bool = False
    """Render-hygiene findings fail (by default they are reported and the run goes on)."""
    design: CacheDesign | None = None
    """What the engine's cache can reuse by design (the reference its efficiency and positive
    control are judged against); None: what the engine declares (``CacheDesign.of``)."""
    decode_atol: float | None = None
    """The atol for a request whose cached run reused KV an earlier decode computed (the
    decode rule); None: the engine's own ``decode_atol`` (absent: exact like the rest)."""
    failures_dir: Path = FAILURES_DIR
    replay_command: Callable[[str], str] = default_replay_command
    started: float = field(default_factory=time.monotonic)
    """The ``time.monotonic()`` a first failure's seconds count from: the session's start in a
    pytest session (its servers' starts included), else when the options were made."""


@dataclass
class Step:
    """What one request gave."""

    request: Request
    cached: Outcome
    uncached: Outcome
    match: Match | None
    comparison: Comparison
