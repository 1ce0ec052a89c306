"""Completing an HTTP Outcome from the logit tap's records (see :mod:`pytest_prefixcache.tap`).

The server's records are followed request by request (:class:`~pytest_prefixcache.tap.tracks.
TapLedger`, several in flight): a reply gets the earliest unclaimed track whose first unpadded
row ends at the reply's ``prompt_tokens`` and whose input ids are the prompt's (when the
adapter knows them; among tracks with the same ids, the one whose greedy tokens agree
furthest with the reply's tokens or text); the track's first row gives the really prefilled
count, its one-position rows the decode steps, its number the order the server took the
request in (``Outcome.served``). Every figure the API also reports is cross-checked against the tap.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Sequence

import numpy as np

from ...errors import EngineError
from ...tap.tracks import Found, TapLedger
from ...types import Outcome
from .server import ServerProcess, remove_quietly

__all__ = ["apply_tap", "attach_tap", "log_tap", "tapped_outcome"]


def attach_tap(proc: ServerProcess, owner: object) -> TapLedger:
    """Make ``proc`` (started under ``python -m pytest_prefixcache.tap``) write its tap records
    to a new file of its own, kept across restarts and removed when ``owner`` is collected;
    returns the ledger of that file's tracks."""
    from ...tap import ENV, TapReader

    path = os.path.join(tempfile.gettempdir(), f"prefixcache-tap-{uuid.uuid4().hex}")
    proc.extra_env[ENV] = path
    weakref.finalize(owner, remove_quietly, path)  # also when never closed
    return TapLedger(TapReader(path))


def tapped_outcome(
    reader: TapLedger,
    out: Outcome,
    completion_tokens: int,
    max_new_tokens: int,
    decode: Decode | None = None,
    reply_id: str | Sequence[str] | None = None,
) -> tuple[Outcome, list[str]]:
    """The API's Outcome completed from the tap (:func:`apply_tap`), its API per-step
    distributions dropped (the tap's replace them), and the API figures the tap contradicts."""
    # usage.completion_tokens can overcount (vllm-mlx 0.6.0 re-encodes the text)
    expected = min(completion_tokens, max(1, max_new_tokens))
    tapped, problems = apply_tap(
        reader, out, expected, max_new_tokens, decode=decode, reply_id=reply_id
    )
    return dataclasses.replace(tapped, step_top_logprobs=()), problems


#: Token ids -> the text a server writes for them (``Vocabulary.decode``).
Decode = Callable[[Sequence[int]], str]


def reply_fits(out: Outcome, decode: Decode | None) -> Callable[[Sequence[int]], int]:
    """How far a track's greedy tokens agree with what ``out`` (the API's reply) generated:
    the leading tokens in common, where the API names its tokens, else the leading characters
    in common of its text and ``decode`` of theirs (0: it cannot tell). A count, not a match:
    a server's streamed text writes a byte-fallback token as U+FFFD where a decode of the
    whole list may join the bytes, so a text seldom equals another decode to the end."""
    if out.tokens:
        mine = tuple(out.tokens)
        return lambda greedy: _common(mine, tuple(greedy))
    text = (out.text or "").lstrip()
    if decode is None or not text:
        return lambda greedy: 0
    return lambda greedy: _common(text, decode(greedy).lstrip())


def _common(a: Sequence[object], b: Sequence[object]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def apply_tap(
    ledger: TapLedger,
    out: Outcome,
    expected: int,
    n: int,
    *,
    wait: float = 5.0,
    decode: Decode | None = None,
    reply_id: str | Sequence[str] | None = None,
) -> tuple[Outcome, list[str]]:
    """``out`` with the tap's logits, step logits, greedy tokens, really reused count, served
    order and how its rows were attributed (``Outcome.attribution``), and the list of API
    figures the tap contradicts. Waits up to ``wait`` seconds for the ``expected`` steps to be
    written. ``decode``: how the server writes token ids as text (tells apart prompts with
    the same ids by their replies' text). ``reply_id``: the ids the exchange may have been
    admitted under by a server whose scheduler the tap labels (its rows, no inference): the
    reply's ``id`` (mlx_lm.server), the client's ``REQUEST_HEADER`` (vllm-mlx)."""
    from ...tap import missing_reason

    if out.prompt_tokens is None:
        raise EngineError("the tap needs usage.prompt_tokens to find the prompt's call")
    deadline = time.monotonic() + wait
    fits = reply_fits(out, decode)
    found: Found | None = None
    while True:
        found = ledger.find(
            out.prompt_tokens, out.token_ids, expected, out.cached_tokens, fits, reply_id
        )
        late = time.monotonic() >= deadline
        ready = found is not None and len(found.steps) >= expected and found.settled
        if found is not None and (late or ready) and ledger.claim(found):
            break
        if late:
            found = None
            break
        time.sleep(0.02)
    if found is None:
        why = ledger.explain(out.prompt_tokens, reply_id) or missing_reason(
            ledger.records(), out.prompt_tokens, ledger.installed, ledger.calls
        )
        raise EngineError(f"no tap record ends at the prompt length {out.prompt_tokens}: {why}")
    steps = found.steps
    reused = found.reused
    logits = [np.asarray(r.logprobs, dtype=np.float32) for r in steps]
    real_tokens = tuple(int(np.argmax(lp)) for lp in logits)
    problems: list[str] = []
    if found.note:
        problems.append(f"the tap's labels contradict its KV offsets: {found.note}")
    if found.ids_checked is False:
        problems.append(
            f"the tap's rows ending at the prompt length {out.prompt_tokens} hold other token "
            "ids than the prompt's: the reply was attributed by its length alone"
        )
    if out.cached_tokens is not None and out.cached_tokens != reused:
        problems.append(
            f"API cached_tokens={out.cached_tokens} but the tap saw "
            f"{out.prompt_tokens - reused} of {out.prompt_tokens} prompt tokens prefilled"
        )
    for tok, lp in (out.top_logprobs or {}).items():
        if tok < len(logits[0]) and abs(float(logits[0][tok]) - lp) > 1e-4:
            problems.append(f"API logprob of token {tok} is {lp}, the tap has {logits[0][tok]}")
            break
    if out.tokens != real_tokens[: len(out.tokens)]:
        problems.append(f"API tokens {out.tokens} but the tap's argmax is {real_tokens}")
    tapped = dataclasses.replace(
        out,
        logits=logits[0],
        tokens=real_tokens[:n],
        step_logits=tuple(logits[: min(n, len(steps))]),
        cached_tokens=reused,
        served=found.served,
        attribution=found.attribution,
    )
    return tapped, problems


def log_tap(
    path: str | os.PathLike[str], *, use_cache: bool, api: Outcome, tapped: Outcome, problems: int
) -> None:
    """Append one request's figures to a JSON-lines file: the prompt length, the reuse the API
    reported (``null`` when it reports none), the reuse the tap saw and how many of the
    API's figures the tap contradicted."""
    line = {
        "use_cache": use_cache,
        "prompt_tokens": tapped.prompt_tokens,
        "api_cached_tokens": api.cached_tokens,
        "tap_reused_tokens": tapped.cached_tokens,
        "disagreements": problems,
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
