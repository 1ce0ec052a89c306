"""The protocol checks: what one outcome, and a cached/uncached pair, must satisfy.

Faults (types, NaN/inf, shapes, dtypes, inconsistent counts, message starts out of order or
outside the prompt), a pair's agreement on the prompt it saw, and the vision merges' shapes
(as many embedding rows as placeholder slots).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..types import Outcome, Request
from .oracle import shared_prefix
from .problem import Problem

__all__ = [
    "Span",
    "fault_problems",
    "merge_problems",
    "pair_problems",
    "span_at",
]

Span = tuple[int, int, str]


def _finite(name: str, arr: object) -> str | None:
    if not isinstance(arr, np.ndarray):
        return f"{name} is a {type(arr).__name__}, not a numpy array"
    if arr.dtype != np.float32:
        return f"{name} has dtype {arr.dtype}, expected float32"
    if arr.ndim != 1 or arr.size == 0:
        return f"{name} has shape {arr.shape}, expected (vocab_size,)"
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return f"{name} holds {int(bad.sum())} non-finite value(s), first {arr[i]} at token id {i}"
    return None


def fault_problems(o: object, request: Request) -> list[Problem]:
    """Protocol faults of one outcome: types, NaN/inf, shapes, dtypes, inconsistent counts."""
    if not isinstance(o, Outcome):
        return [Problem("fault", f"run() returned a {type(o).__name__}, not an Outcome")]
    msgs: list[str] = []
    if o.unreported_stop:  # stopped before its first token, which it did not report
        if o.tokens or o.logits is not None or o.top_logprobs is not None:
            msgs.append(
                f"unreported_stop (no first token reported) but {len(o.tokens)} new tokens, "
                f"logits {'given' if o.logits is not None else 'None'}, top_logprobs "
                f"{'given' if o.top_logprobs is not None else 'None'}"
            )
    elif o.logits is None and o.top_logprobs is None:
        msgs.append("the Outcome has neither logits nor top_logprobs")
    if o.logits is not None:
        msgs.append(_finite("logits", o.logits) or "")
    for i, s in enumerate(o.step_logits):
        msgs.append(_finite(f"step_logits[{i}]", s) or "")
        if o.logits is not None and isinstance(s, np.ndarray) and s.shape != o.logits.shape:
            msgs.append(f"step_logits[{i}] has shape {s.shape} but logits {o.logits.shape}")
    if o.top_logprobs is not None:
        vals = list(o.top_logprobs.values())
        if len(vals) < 5:
            msgs.append(f"top_logprobs has {len(vals)} entries, expected at least 5")
        if any(not math.isfinite(float(v)) or float(v) > 1e-6 for v in vals):
            msgs.append(f"top_logprobs holds values that are not finite log-probabilities: {vals}")
    if o.step_logits and len(o.step_logits) not in (len(o.tokens), len(o.tokens) + 1):
        msgs.append(f"{len(o.step_logits)} step_logits for {len(o.tokens)} new tokens")
    n_top = len(o.step_top_logprobs)
    if n_top and n_top not in (len(o.tokens), len(o.tokens) + 1):
        msgs.append(f"{n_top} step_top_logprobs for {len(o.tokens)} new tokens")
    if len(o.tokens) > request.max_new_tokens:
        msgs.append(f"{len(o.tokens)} new tokens for max_new_tokens={request.max_new_tokens}")
    n = (
        o.prompt_tokens
        if o.prompt_tokens is not None
        else (len(o.token_ids) if o.token_ids is not None else None)
    )
    if o.token_ids is not None and o.prompt_tokens is not None and len(o.token_ids) != n:
        msgs.append(f"prompt_tokens={o.prompt_tokens} but token_ids has {len(o.token_ids)}")
    if o.cached_tokens is not None:
        if o.cached_tokens < 0:
            msgs.append(f"cached_tokens={o.cached_tokens} is negative")
        if n is not None and o.cached_tokens > n:
            msgs.append(f"cached_tokens={o.cached_tokens} exceeds prompt_tokens={n}")
    if o.image_spans is not None:
        got = [d for _, _, d in o.image_spans]
        want = [img.digest for img in request.images]
        if got != want:
            msgs.append(
                "image_spans name images "
                + _digests(got)
                + " but the request has "
                + _digests(want)
            )
        for start, end, d in o.image_spans:
            if not 0 <= start < end <= (n if n is not None else end):
                msgs.append(
                    f"image span [{start}, {end}) of {d[:12]} is outside the prompt (length {n})"
                )
    if o.message_starts is not None:
        msgs.append(_starts_problem(o.message_starts, n) or "")
    return [Problem("fault", m) for m in msgs if m]


def _starts_problem(starts: object, n: int | None) -> str | None:
    """What is wrong with ``message_starts``: positions of the prompt, strictly ascending."""
    ints = isinstance(starts, (tuple, list)) and all(
        isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in starts
    )
    if not ints:
        return f"message_starts must be a tuple of ints, got {starts!r:.200}"
    pos = [int(p) for p in starts]  # type: ignore[attr-defined]
    if any(b <= a for a, b in itertools.pairwise(pos)):
        return f"message_starts {_short(pos)} are not strictly ascending"
    bad = [p for p in pos if p < 0 or (n is not None and p >= n)]
    if bad:
        where = f"[0, {n})" if n is not None else "0 or more"
        return f"message_starts holds {_short(bad)}, outside the prompt's positions {where}"
    return None


def _short(xs: list[int], limit: int = 8) -> str:
    return "[" + ", ".join(map(str, xs[:limit])) + (", ...]" if len(xs) > limit else "]")


def _digests(ds: list[str]) -> str:
    return "[" + ", ".join(d[:12] for d in ds) + "]"


def pair_problems(cached: Outcome, uncached: Outcome) -> list[Problem]:
    """The cached and uncached runs must see the same prompt and return the same shapes."""
    msgs = []
    if cached.token_ids is not None and uncached.token_ids is not None:
        a, b = tuple(cached.token_ids), tuple(uncached.token_ids)
        if a != b:
            i = shared_prefix(a, b)
            msgs.append(
                f"the prompt's token_ids differ between runs from position {i} (lengths "
                f"{len(a)} vs {len(b)}): rendering the same request is not deterministic"
            )
    elif cached.prompt_tokens is not None and uncached.prompt_tokens is not None:
        if cached.prompt_tokens != uncached.prompt_tokens:
            msgs.append(
                f"prompt_tokens differ between runs: cached {cached.prompt_tokens} vs uncached "
                f"{uncached.prompt_tokens}: rendering the same request is not deterministic"
            )
    if cached.image_spans is not None and uncached.image_spans is not None:
        if tuple(cached.image_spans) != tuple(uncached.image_spans):
            msgs.append(
                f"image_spans differ: cached {_spans(cached.image_spans)} vs uncached "
                f"{_spans(uncached.image_spans)}"
            )
    for name in ("logits",):
        a_arr, b_arr = getattr(cached, name), getattr(uncached, name)
        if a_arr is not None and b_arr is not None and a_arr.shape != b_arr.shape:
            return [
                Problem(
                    "fault", f"{name} shape differs: cached {a_arr.shape} vs uncached {b_arr.shape}"
                )
            ]
    if (cached.logits is None) != (uncached.logits is None):
        return [Problem("fault", "one run returned logits and the other did not")]
    return [Problem("render stability", m) for m in msgs]


def _spans(spans: object) -> str:
    return "[" + ", ".join(f"({s}, {e}, {d[:12]})" for s, e, d in spans) + "]"  # type: ignore[attr-defined]


def span_at(spans: tuple[Span, ...] | None, position: int) -> Span | None:
    """The image span that contains ``position`` (or, failing that, the last one before it)."""
    if not spans:
        return None
    for s in spans:
        if s[0] <= position < s[1]:
            return s
    before = [s for s in spans if s[1] <= position]
    return before[-1] if before else None


def merge_problems(o: Outcome) -> list[Problem]:
    """Every merge fills as many placeholder slots as it has embedding rows; merges cover the
    placeholders the run had to compute."""
    probs = []
    for i, (slots, rows) in enumerate(o.merges or ()):
        if slots != rows:
            probs.append(
                Problem(
                    "shapes",
                    f"vision merge {i} filled {slots} placeholder slots with {rows} embedding rows",
                )
            )
    if o.merges is not None and o.image_spans is not None and not probs:
        cached = o.cached_tokens or 0
        need = sum(max(0, e - max(s, cached)) for s, e, _ in o.image_spans)
        have = sum(slots for slots, _ in o.merges)
        if have < need:
            probs.append(
                Problem(
                    "shapes",
                    f"merges filled {have} placeholder slots but "
                    f"{need} placeholders lie after the cached prefix",
                )
            )
    return probs
