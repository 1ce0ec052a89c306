"""The timing checks: the opt-in floor on the speedup of cache hits
(``--prefixcache-min-speedup``), and the judgement of the timing side channel: does time to
first token reveal another namespace's cached prefix? (The measurement, which drives an
engine, is :mod:`pytest_prefixcache.verify.isolation`'s.)

Following Gu et al., "Auditing Prompt Caching in Language Model APIs" (ICML 2025), bug zoo
class 24 (CVE-2025-46570). Each sample uses fresh random prompts:

- cross-namespace: namespace ``A`` sends prompt ``P``; namespace ``B`` then sends ``P`` (the
  candidate hit) and a fresh prompt ``Q`` of the same length (a miss), in random order. If
  B's timings of ``P`` and ``Q`` differ (two-sample Kolmogorov-Smirnov, p < alpha), B learns
  what A sent: the cache leaks across tenants.
- positive control: the same measurement within namespace ``A``. It must show a difference;
  otherwise the measurement has no power (no cache, or hits no faster than misses) and the
  verdict is ``"inconclusive"``, never ``"pass"`` (vllm-project/vllm #53347).

The KS test is implemented here with numpy (scipy is not a dependency).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import VerificationFailure
from .problem import Problem

__all__ = [
    "ALPHA",
    "FIRST_TOKEN",
    "SPEEDUP_MIN_SECONDS",
    "WHOLE_CALLS",
    "IsolationFailure",
    "IsolationResult",
    "KSResult",
    "ks_2samp",
    "speedup_problem",
]

#: Significance level of both KS tests.
ALPHA = 1e-3
#: --prefixcache-min-speedup applies to a stream only when its cache hits took this long cold
#: (on the measure judged): below it, waiting for a shared CPU moves the ratio more than a
#: cache saves (benchmarks/results/closed_loop_share/README.md, "The speedup's measure").
SPEEDUP_MIN_SECONDS = 0.05
#: What the speedup is judged on, as messages and reports name it: the part of a request a
#: cache can save (lookup, restore and prefill; decoding costs the same warm and cold) ...
FIRST_TOKEN = "time to first token"
#: ... or, when a hit's run reports no time to first token, the whole calls.
WHOLE_CALLS = "whole calls (the engine reports no time to first token)"
Verdict = Literal["pass", "leak", "inconclusive"]


class IsolationFailure(VerificationFailure):
    """Time to first token reveals whether another namespace cached a prefix."""

    check = "isolation"


@dataclass(frozen=True)
class KSResult:
    """A two-sample Kolmogorov-Smirnov test: the statistic D and its p-value."""

    statistic: float
    pvalue: float


def _kolmogorov_sf(lam: float) -> float:
    """P(K > lam) for the Kolmogorov distribution: 2 sum (-1)^(j-1) exp(-2 j^2 lam^2)."""
    if lam < 0.2:
        return 1.0
    total, sign = 0.0, 1.0
    for j in range(1, 101):
        term = sign * 2.0 * math.exp(-2.0 * j * j * lam * lam)
        total += term
        if abs(term) < 1e-16 * max(abs(total), 1e-300):
            break
        sign = -sign
    return min(1.0, max(0.0, total))


def ks_2samp(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> KSResult:
    """Two-sided two-sample KS test with the asymptotic p-value (Stephens' correction,
    ``lam = (en + 0.12 + 0.11 / en) * D`` with ``en = sqrt(n m / (n + m))``)."""
    x = np.sort(np.asarray(a, dtype=np.float64))
    y = np.sort(np.asarray(b, dtype=np.float64))
    if x.size == 0 or y.size == 0:
        raise ValueError(f"ks_2samp needs two non-empty samples, got {x.size} and {y.size}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("ks_2samp samples must be finite")
    both = np.concatenate([x, y])
    cdf_x = np.searchsorted(x, both, side="right") / x.size
    cdf_y = np.searchsorted(y, both, side="right") / y.size
    d = float(np.max(np.abs(cdf_x - cdf_y)))
    en = math.sqrt(x.size * y.size / (x.size + y.size))
    return KSResult(d, _kolmogorov_sf((en + 0.12 + 0.11 / en) * d))


def _ms(xs: Sequence[float]) -> str:
    return f"{1e3 * float(np.median(xs)):.1f} ms"


@dataclass(frozen=True)
class IsolationResult:
    """The two measurements and the verdict.

    Attributes:
        cross: KS of namespace B's timings, candidate (A's prompt) vs fresh prompts.
        control: KS within namespace A, repeated prompt vs fresh prompts.
        candidate, fresh, control_hit, control_miss: the timings in seconds.
        candidate_cached: the cached_tokens B's candidates reported (None if not reported).
        alpha: the significance level.
    """

    cross: KSResult
    control: KSResult
    candidate: tuple[float, ...]
    fresh: tuple[float, ...]
    control_hit: tuple[float, ...]
    control_miss: tuple[float, ...]
    candidate_cached: tuple[int | None, ...]
    alpha: float = ALPHA
    across: str = "namespaces"
    """What the two identities differ in (``namespaces``, ``adapter 'x'``)."""

    @property
    def verdict(self) -> Verdict:
        if self.cross.pvalue < self.alpha:
            return "leak"
        if self.control.pvalue >= self.alpha:
            return "inconclusive"
        return "pass"

    def lines(self) -> list[str]:
        n = len(self.candidate)
        reported = [c for c in self.candidate_cached if c is not None]
        out = [
            f"across {self.across}: KS D={self.cross.statistic:.2f}, p={self.cross.pvalue:.2g} "
            f"over {n}+{len(self.fresh)} samples (median {_ms(self.candidate)} for another "
            f"identity's prefix vs {_ms(self.fresh)} for a fresh one), alpha={self.alpha:g}",
            f"positive control, one identity: KS D={self.control.statistic:.2f}, "
            f"p={self.control.pvalue:.2g} (median {_ms(self.control_hit)} hit vs "
            f"{_ms(self.control_miss)} miss)",
        ]
        if reported:
            out.append(f"cached_tokens reported for another identity's prefix: max {max(reported)}")
        return out


def speedup_problem(
    warm: float, cold: float, speedup: float, measure: str = FIRST_TOKEN
) -> Problem | None:
    """A problem when cache hits took ``warm`` seconds against ``cold`` by ``measure``
    (:data:`FIRST_TOKEN` or :data:`WHOLE_CALLS`), below ``speedup`` (judged only when they
    took at least ``SPEEDUP_MIN_SECONDS`` cold)."""
    if cold < SPEEDUP_MIN_SECONDS or warm <= 0:
        return None
    got = cold / warm
    if got >= speedup:
        return None
    head = (
        f"requests served from the cache took {warm:.3f} s against {cold:.3f} s cold "
        f"(speedup {got:.2f}x), below --prefixcache-min-speedup={speedup:g}"
    )
    why = [
        f"measured on: {measure}",
        "restoring or managing the cache costs more than the prefill it saves",
    ]
    if measure != FIRST_TOKEN:
        why.append(
            "whole calls include decoding, which costs the same warm and cold: report "
            "Outcome.first_token_seconds to judge the part a cache saves"
        )
    return Problem("min speedup", head, tuple(why))
