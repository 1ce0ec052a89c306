"""The claims check: what an engine claimed against what its model computed.

An engine reports reuse in many places besides ``usage.prompt_tokens_details.cached_tokens``
(stats endpoints, Prometheus counters, log lines, response headers) and the per-step logprobs
of its API; operators read those. With the logit tap, :attr:`Outcome.claims` holds every
declared source's figure and the API's distribution per decode step next to what the model
computed: the prompt tokens it did not prefill and its log-softmax before each generated token.

- **Reuse claims**: a ``tokens`` figure must equal the tokens the model reused; a ``hits``
  figure must be above 0 exactly when it reused something; a ``misses`` figure exactly when it
  reused nothing. A difference names the source, both numbers and the raw text. Without a tap
  the sources are only compared with each other (and coverage counts the check as not run).
- **Step alignment** (check ``"step alignment"`` in the coverage, failing as ``"claims"``):
  the API's distribution for decode step i must be the model's for step i: by token id when
  entries name one, else by value (the sorted logprobs against the model's top k). A
  distribution that is the model's step i-1 or i+1 is reported as shifted; the API must carry
  one distribution per generated token, no more, no fewer.

Claims are required only where declared: an engine without claim sources, or whose reply has
no per-step logprobs, has nothing to check; an engine that declares claim sources without a
tap could not be checked, and coverage says so (:func:`.coverage.claims_coverage`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..types import Claim, Claims, Outcome, StepEntry
from .problem import Problem

__all__ = [
    "CLAIMS",
    "STEPS",
    "STEP_TOLERANCE",
    "alignment_problems",
    "claim_problems",
    "claims_counts",
    "reuse_claim_problems",
]

#: The check's name (its failures, the coverage row of the reuse claims).
CLAIMS = "claims"
#: The coverage row of the per-step alignment (its failures are ``claims`` failures).
STEPS = "step alignment"
#: Largest |API logprob - the model's| at a decode step that still matches.
STEP_TOLERANCE = 1e-3
#: Steps listed in a misalignment's details.
_SHOWN = 5


def claims_counts(o: Outcome) -> tuple[int, int]:
    """(reuse figures compared, decode steps aligned) on one outcome."""
    c = o.claims
    if c is None:
        return 0, 0
    figures = sum(cl.value is not None for cl in c.reuse) if c.reused is not None else 0
    steps = 0
    if c.steps is not None and c.computed_steps is not None:
        steps = max(len(c.steps), len(c.computed_steps))
    return figures, steps


def claim_problems(o: Outcome, tolerance: float = STEP_TOLERANCE) -> list[Problem]:
    """Every reuse claim and decode step of ``o`` that differs from what its model computed."""
    c = o.claims
    if c is None:
        return []
    return reuse_claim_problems(c) + alignment_problems(c, tolerance)


def _says(claim: Claim) -> str:
    v = claim.value or 0
    if claim.unit == "tokens":
        return f"{v} prompt token(s) reused"
    hit = v > 0 if claim.unit == "hits" else v == 0
    return f"{v} {claim.unit} (a {'hit' if hit else 'miss'})"


def _agrees(claim: Claim, reused: int) -> bool:
    v = claim.value
    assert v is not None
    if claim.unit == "tokens":
        return v == reused
    if claim.unit == "hits":
        return (v > 0) == (reused > 0)
    return (v > 0) == (reused == 0)


def reuse_claim_problems(c: Claims) -> list[Problem]:
    """Every reuse figure that differs from the tokens the model did not prefill; without a
    tap, every figure that contradicts the first (a ``tokens`` one if any)."""
    if c.reused is None:
        return _contradictions(c.reuse)
    out = []
    prompt = "?" if c.prompt_tokens is None else c.prompt_tokens
    computed = "?" if c.prompt_tokens is None else c.prompt_tokens - c.reused
    for claim in c.reuse:
        if claim.value is None or _agrees(claim, c.reused):
            continue
        head = (
            f"{claim.source} claims {_says(claim)}, but the model prefilled {computed} of "
            f"{prompt} prompt tokens (reused {c.reused}, the logit tap)"
        )
        out.append(Problem(CLAIMS, head, (f"raw text of {claim.source}: {claim.raw[:300]}",)))
    return out


def _contradictions(claims: Sequence[Claim]) -> list[Problem]:
    said = [cl for cl in claims if cl.value is not None]
    ref = next((cl for cl in said if cl.unit == "tokens"), said[0] if said else None)
    if ref is None or ref.value is None:
        return []
    reused = ref.value if ref.unit == "tokens" else int(_agrees(ref, 1))
    out = []
    for cl in said:
        if cl is ref or _agrees(cl, reused):
            continue
        head = (
            f"{cl.source} claims {_says(cl)}, but {ref.source} claims {_says(ref)} (no tap: "
            "which one is wrong is not known)"
        )
        raws = tuple(f"raw text of {x.source}: {x.raw[:300]}" for x in (cl, ref))
        out.append(Problem(CLAIMS, head, raws))
    return out


def _gap(entries: Sequence[StepEntry], model: np.ndarray) -> tuple[float, str]:
    """(largest |API - model| over the entries, how they were matched)."""
    if all(e.token_id is not None and 0 <= e.token_id < len(model) for e in entries):
        gap = max(abs(e.logprob - float(model[e.token_id])) for e in entries)  # type: ignore[index]
        return gap, "id"
    api = np.sort(np.array([e.logprob for e in entries], dtype=np.float64))[::-1]
    top = np.sort(model.astype(np.float64))[::-1][: len(api)]
    return float(np.max(np.abs(api - top))), "value"


def _entries(entries: Sequence[StepEntry]) -> str:
    shown = ", ".join(
        f"{e.text or e.token_id}={e.logprob:.5g}"
        for e in sorted(entries, key=lambda e: -e.logprob)[:4]
    )
    return f"[{shown}{', ...' if len(entries) > 4 else ''}]"


def _top(model: np.ndarray) -> str:
    ids = np.argsort(-model)[:4]
    return "[" + ", ".join(f"{int(i)}={float(model[i]):.5g}" for i in ids) + ", ...]"


def alignment_problems(c: Claims, tolerance: float = STEP_TOLERANCE) -> list[Problem]:
    """Every decode step whose API distribution is not the model's for that step, and every
    missing or extra step. One problem: the first bad step heads it, the others follow."""
    if c.steps is None or c.computed_steps is None:
        return []
    api, model = c.steps, c.computed_steps
    lines: list[str] = []
    first = ""
    for i in range(max(len(api), len(model))):
        if i >= len(api):
            line = f"step {i}: missing: the API has no distribution for generated token {i}"
        elif i >= len(model):
            line = (
                f"step {i}: extra: the model generated {len(model)} token(s), the API has "
                f"{len(api)} distributions"
            )
        elif not api[i]:
            line = f"step {i}: empty: the API's distribution has no entries"
        elif any(not math.isfinite(e.logprob) for e in api[i]):
            line = f"step {i}: not a number: the API's distribution is {_entries(api[i])}"
        else:
            gap, how = _gap(api[i], model[i])
            if gap <= tolerance:
                continue
            near = [
                j
                for j in (i - 1, i + 1)
                if 0 <= j < len(model) and _gap(api[i], model[j])[0] <= tolerance
            ]
            what = f"shifted: it is the model's step {near[0]}" if near else "differs"
            line = (
                f"step {i}: {what} (matched by {how}, largest difference {gap:.3g} > "
                f"{tolerance:g}): API {_entries(api[i])}, model {_top(model[i])}"
            )
        first = first or line
        lines.append(line)
    if not lines:
        return []
    head = (
        f"the API's per-step logprobs do not align with the {len(model)} decode step(s) the "
        f"model computed: {first.split(' (')[0]}"
    )
    more = [f"... and {len(lines) - _SHOWN} more step(s)"] if len(lines) > _SHOWN else []
    return [Problem(CLAIMS, head, tuple(lines[:_SHOWN] + more))]
