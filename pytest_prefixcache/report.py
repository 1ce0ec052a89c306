"""The session report: counters the checks fill in, a terminal summary and a JSON file.

:class:`Report` is a plain object: the plugin keeps one in ``config.stash``, the verifier
adds to it, and the terminal summary only prints :meth:`Report.lines`.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FailureRecord", "Report"]


def _finite(x: float) -> float | str:
    """JSON has no inf or NaN: write them as strings."""
    return x if math.isfinite(x) else str(x)


@dataclass(frozen=True)
class FailureRecord:
    """One failed test: which check, where, the first line of the message, the replay file."""

    check: str
    test: str
    summary: str
    replay: str | None = None


@dataclass
class Report:
    """What the verification saw in this session."""

    seed: int | None = None
    engine: str = ""
    tolerance: str = "exact"
    requests: int = 0
    cache_hits: int = 0
    reused_tokens: int = 0
    oracle_tokens: int = 0
    worst_diff: float = 0.0
    worst_diff_where: str = ""
    worst_kl: float = 0.0
    merges_checked: int = 0
    streams: int = 0
    warm_seconds: float = 0.0
    """Engine time of the cached runs that hit the cache."""
    cold_seconds: float = 0.0
    """Engine time of the uncached runs of the same requests."""
    failures: list[FailureRecord] = field(default_factory=list)

    @property
    def efficiency(self) -> float | None:
        """Reused tokens / the oracle's maximum valid reuse (None when nothing was reusable)."""
        if self.oracle_tokens == 0:
            return None
        return self.reused_tokens / self.oracle_tokens

    @property
    def failures_by_check(self) -> dict[str, int]:
        return dict(Counter(f.check for f in self.failures))

    def add_diff(self, diff: float, where: str) -> None:
        if diff > self.worst_diff or (diff != diff):  # NaN counts as worst
            self.worst_diff, self.worst_diff_where = diff, where

    def lines(self) -> list[str]:
        """The terminal summary, one line per item."""
        eff = self.efficiency
        eff_text = (
            "n/a (nothing was reusable)"
            if eff is None
            else f"{eff:.1%} ({self.reused_tokens} of {self.oracle_tokens} reusable tokens)"
        )
        worst = f"{self.worst_diff:.3g}"
        if self.worst_diff_where:
            worst += f" ({self.worst_diff_where})"
        out = [
            f"engine: {self.engine or '?'}; tolerance: {self.tolerance}",
            f"requests run: {self.requests} in {self.streams} stream(s), "
            f"{self.cache_hits} with cache hits",
            f"cache efficiency vs oracle: {eff_text}",
            f"worst |cached - uncached|: {worst}",
            f"merges checked: {self.merges_checked}",
        ]
        if self.warm_seconds > 0:
            out.append(
                f"time on cache hits: {self.warm_seconds:.2f} s warm vs {self.cold_seconds:.2f} s "
                f"cold (speedup {self.cold_seconds / self.warm_seconds:.2f}x)"
            )
        if self.worst_kl:
            out.append(f"worst estimated KL: {self.worst_kl:.3g}")
        by = self.failures_by_check
        if by:
            out.append(
                "failures by check: " + ", ".join(f"{k}: {v}" for k, v in sorted(by.items()))
            )
            out.extend(f"  replay: {f.replay}" for f in self.failures if f.replay)
        else:
            out.append("failures by check: none")
        if self.seed is not None:
            out.append(f"reproduce with --prefixcache-seed={self.seed}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "engine": self.engine,
            "tolerance": self.tolerance,
            "streams": self.streams,
            "requests": self.requests,
            "cache_hits": self.cache_hits,
            "reused_tokens": self.reused_tokens,
            "oracle_tokens": self.oracle_tokens,
            "efficiency": self.efficiency,
            "worst_diff": _finite(self.worst_diff),
            "worst_diff_where": self.worst_diff_where,
            "worst_kl": _finite(self.worst_kl),
            "merges_checked": self.merges_checked,
            "warm_seconds": self.warm_seconds,
            "cold_seconds": self.cold_seconds,
            "failures_by_check": self.failures_by_check,
            "failures": [
                {"check": f.check, "test": f.test, "summary": f.summary, "replay": f.replay}
                for f in self.failures
            ],
        }

    def write_json(self, path: str | os.PathLike[str]) -> None:
        parent = os.path.dirname(os.fspath(path))
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_json(), fh, indent=2, allow_nan=False, default=str)
            fh.write("\n")
