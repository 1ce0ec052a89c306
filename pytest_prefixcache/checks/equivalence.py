"""Comparing a cached outcome with the uncached one: exact, atol/rtol, or the top-k/KL rule.

Comparison keeps going after the first difference, so a failure can report both the first
and the worst position; greedy tokens are compared too, and steps after a legitimate
divergence (a near-tie under a non-exact tolerance) are not compared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..types import Outcome
from .oracle import shared_prefix
from .problem import Problem

__all__ = ["TOP_K_KL", "Comparison", "Diff", "Tolerance", "compare"]

TOP_K_KL = 20


@dataclass(frozen=True)
class Tolerance:
    """How close a cached value must be to the uncached one.

    Exact by default. With ``kl`` set, a step passes when the estimated KL divergence
    ``sum p_u * (exp(r) - 1 - r)`` over the uncached top tokens (``r = logp_c - logp_u``) is at
    most ``kl`` and each side's top token is among the other's top tokens (the SGLang rule).
    """

    atol: float = 0.0
    rtol: float = 0.0
    kl: float | None = None

    @property
    def exact(self) -> bool:
        return self.atol == 0.0 and self.rtol == 0.0 and self.kl is None

    def describe(self) -> str:
        if self.kl is not None:
            return f"KL <= {self.kl:g} with top-token agreement"
        return "exact" if self.exact else f"atol={self.atol:g}, rtol={self.rtol:g}"


@dataclass(frozen=True)
class Diff:
    """One compared value: step, vocabulary index, both values and |cached - uncached|."""

    step: int
    index: int
    cached: float
    uncached: float
    diff: float

    def describe(self) -> str:
        where = "last prompt position" if self.step == 0 else f"before new token {self.step}"
        return (
            f"step {self.step} ({where}), token id {self.index}: cached {self.cached:.9g} vs "
            f"uncached {self.uncached:.9g} (|diff| {self.diff:.3g})"
        )


@dataclass
class Comparison:
    """The result of comparing a cached outcome with the uncached one."""

    steps: int = 0
    decode_steps: int = 0
    """Of :attr:`steps`, those after the first token (computed by a decode step)."""
    worst: Diff | None = None
    first_bad: Diff | None = None
    worst_bad: Diff | None = None
    bad_steps: list[int] = field(default_factory=list)
    worst_kl: float = 0.0
    problems: list[Problem] = field(default_factory=list)

    @property
    def worst_diff(self) -> float:
        return 0.0 if self.worst is None else self.worst.diff


def _as_pairs(values: np.ndarray | Mapping[int, float]) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(values, Mapping):
        ids = np.array(sorted(int(k) for k in values), dtype=np.int64)
        return ids, np.array([float(values[int(k)]) for k in ids], dtype=np.float64)
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    return np.arange(arr.size, dtype=np.int64), arr


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = float(np.max(x))
    return x - (m + math.log(float(np.sum(np.exp(x - m)))))


def _compare_step(step: int, c: object, u: object, tol: Tolerance, out: Comparison) -> None:
    c_ids, c_vals = _as_pairs(c)  # type: ignore[arg-type]
    u_ids, u_vals = _as_pairs(u)  # type: ignore[arg-type]
    common, ci, ui = np.intersect1d(c_ids, u_ids, assume_unique=True, return_indices=True)
    cv, uv = c_vals[ci], u_vals[ui]
    diff = np.abs(cv - uv)
    diff[np.isnan(diff)] = np.inf
    bad = np.zeros(len(common), dtype=bool)
    if tol.kl is None:
        bad = diff > tol.atol + tol.rtol * np.abs(uv)
    if len(common):
        w = int(np.argmax(diff))
        d = Diff(step, int(common[w]), float(cv[w]), float(uv[w]), float(diff[w]))
        if out.worst is None or d.diff > out.worst.diff:
            out.worst = d
    step_bad = bool(bad.any())
    notes: list[str] = []
    if len(common) < max(len(c_ids), len(u_ids)) and (tol.exact or tol.kl is None):
        only_c = sorted(set(c_ids.tolist()) - set(common.tolist()))[:5]
        only_u = sorted(set(u_ids.tolist()) - set(common.tolist()))[:5]
        if tol.exact or only_c[:1] == [int(c_ids[np.argmax(c_vals)])]:
            step_bad = True
            notes.append(
                f"step {step}: top tokens differ: only cached {only_c}, only uncached {only_u}"
            )
    if tol.kl is not None:
        lc = _log_softmax(c_vals) if not isinstance(c, Mapping) else c_vals
        lu = _log_softmax(u_vals) if not isinstance(u, Mapping) else u_vals
        top_u = np.argsort(-lu)[: min(TOP_K_KL, len(lu))]
        top_c = np.argsort(-lc)[: min(TOP_K_KL, len(lc))]
        ids_u, ids_c = set(u_ids[top_u].tolist()), set(c_ids[top_c].tolist())
        pos_c = {int(t): i for i, t in enumerate(c_ids)}
        sel = [i for i in top_u if int(u_ids[i]) in pos_c]
        r = np.array([lc[pos_c[int(u_ids[i])]] - lu[i] for i in sel])
        p = np.exp(lu[sel])
        kl = float(np.sum(p * (np.exp(r) - 1 - r)) / max(float(np.sum(p)), 1e-30)) if sel else 0.0
        if math.isnan(kl):
            kl = math.inf
        out.worst_kl = max(out.worst_kl, kl)
        top1_ok = int(c_ids[top_c[0]]) in ids_u and int(u_ids[top_u[0]]) in ids_c
        if kl > tol.kl or not top1_ok:
            step_bad = True
            notes.append(
                f"step {step}: estimated KL {kl:.3g} (limit {tol.kl:g}), top token "
                f"cached {int(c_ids[top_c[0]])} vs uncached {int(u_ids[top_u[0]])}"
            )
    if step_bad:
        out.bad_steps.append(step)
        if bad.any():
            idx = np.flatnonzero(bad)
            f = int(idx[0])
            first = Diff(step, int(common[f]), float(cv[f]), float(uv[f]), float(diff[f]))
            if out.first_bad is None:
                out.first_bad = first
            w = int(idx[np.argmax(diff[idx])])
            worst = Diff(step, int(common[w]), float(cv[w]), float(uv[w]), float(diff[w]))
            if out.worst_bad is None or worst.diff > out.worst_bad.diff:
                out.worst_bad = worst
        out.problems.extend(Problem("equivalence", n) for n in notes)


def _steps(o: Outcome) -> list[object]:
    first: object = o.logits if o.logits is not None else o.top_logprobs
    rest: list[object] = list(o.step_logits[1:] if o.step_logits else o.step_top_logprobs[1:])
    return [first, *rest]


def _near_tie(logits: object, a: int, b: int, tol: Tolerance) -> bool:
    if tol.exact or logits is None:
        return False
    ids, vals = _as_pairs(logits)  # type: ignore[arg-type]
    where = {int(t): float(v) for t, v in zip(ids, vals)}
    if a not in where or b not in where:
        return tol.kl is not None
    return abs(where[a] - where[b]) <= tol.atol + tol.rtol * abs(where[b]) + 1e-6


def _stop_notes(cached: Outcome, uncached: Outcome) -> tuple[str, ...]:
    """What a side that stopped before its first token (``unreported_stop``) means."""
    return tuple(
        f"the {side} run stopped before its first token without reporting it (finish_reason "
        "stop, 0 completion tokens): its greedy first token was a stop token"
        for side, o in (("cached", cached), ("uncached", uncached))
        if o.unreported_stop
    )


def compare(cached: Outcome, uncached: Outcome, tol: Tolerance) -> Comparison:
    """Compare every step's logits and the greedy tokens; keep going after a difference."""
    out = Comparison()
    c_steps, u_steps = _steps(cached), _steps(uncached)
    ct, ut = tuple(cached.tokens), tuple(uncached.tokens)
    split = None if ct == ut else shared_prefix(ct, ut)
    n = min(len(c_steps), len(u_steps))
    if split is not None:
        n = min(n, split + 1)
    for step in range(n):
        if c_steps[step] is not None and u_steps[step] is not None:
            _compare_step(step, c_steps[step], u_steps[step], tol, out)
            out.steps += 1
            out.decode_steps += step > 0
    if split is not None:
        a = ct[split] if split < len(ct) else None
        b = ut[split] if split < len(ut) else None
        tie = (
            a is not None
            and b is not None
            and split < len(u_steps)
            and _near_tie(u_steps[split], a, b, tol)
        )
        if not tie:
            out.problems.append(
                Problem(
                    "equivalence",
                    f"greedy tokens differ at new token {split}: cached {ct} vs uncached {ut}",
                    _stop_notes(cached, uncached),
                )
            )
    if out.first_bad is not None:
        lines = [f"first difference: {out.first_bad.describe()}"]
        if out.worst_bad is not None:
            lines.append(f"worst difference: {out.worst_bad.describe()}")
        head = (
            f"logits differ beyond the tolerance ({tol.describe()}) at "
            f"{len(out.bad_steps)} of {out.steps} step(s)"
        )
        out.problems.insert(0, Problem("equivalence", head, tuple(lines)))
    return out
