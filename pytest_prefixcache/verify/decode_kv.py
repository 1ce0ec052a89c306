"""Does the engine's decode compute the KV of the last token it generates? Asked of the engine.

The correctness bound counts an earlier request's output tokens as KV a cache may hold; whether
the last one counts depends on the engine's decode loop. mlx-lm's ``generate_step`` (and its
``BatchGenerator``) feeds every token it yields back through the model before returning it, so
``max_tokens: 1`` leaves the prompt + that token cached; the reference engine never feeds the
last token back. The answer is the engine's, not assumed:

- **declared**: an in-process engine whose decode loop is known says so with ``last_token_kv``
  (True or False);
- **probed**: otherwise, before the first stream, the engine is sent a prompt with
  ``max_new_tokens=2``, then the same conversation continued by its reply and a new user turn.
  Where an observer of the model saw the first request's forward calls (the logit tap: the
  engine's optional method ``kv_computed``, asked after the second request so that a row
  written after the reply counts), its rows say it: they end at the prompt + every generated
  token when the decode fed the last one back (computed), one short when it did not. Else
  the reuse the engine reports on the second (its ``cached_tokens``) says how far the first
  decode's KV went: the prompt + the generated token (computed), or the prompt + all but it
  (not). The cache is reset after. A probe that cannot tell (no rows and no token ids, no
  reuse figure, a reply the chat template re-tokenises differently, a cache that kept none of
  the reply or reuses whole blocks only) tries the next prompt, and after the last says
  ``unknown`` with the reason;
- **unknown**: the bound counts the last token (the generous side: no false failure), and the
  report says it was not measured.

The answer is written in the report (``Report.last_kv``) and the terminal summary.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import shared_prefix
from ..errors import EngineError, PrefixCacheError
from ..traits import optional_method, traits_of
from ..types import Engine, Message, Outcome, Request

__all__ = ["PROBE_PROMPTS", "LastKv", "decoded_tokens", "last_kv_of", "probe_last_kv"]

#: The probe's first user turns, tried in order until one gives an answer.
PROBE_PROMPTS = (
    "Name one colour of the sky at noon.",
    "Count from one to five, in words, separated by commas.",
    "Write the next word: the quick brown fox jumps over the lazy",
)
#: The probe's second user turn, after the reply.
PROBE_FOLLOW_UP = "Say that once more."

#: (what, fn) -> fn's result: the verifier's guarded engine call (timeout, worker thread).
Call = Callable[[str, Callable[[], object]], object]


@dataclass(frozen=True)
class LastKv:
    """The engine's answer: ``computed`` True, False, or None (unknown), and how it was
    learned (one phrase, for the report)."""

    computed: bool | None
    how: str

    def line(self) -> str:
        """The report's line."""
        what = {True: "computed", False: "not computed", None: "unknown"}[self.computed]
        bound = (
            "the reuse bound counts every output token"
            if self.computed is not False
            else "the reuse bound counts all output tokens but the last"
        )
        return f"KV of a decode's last token: {what} ({self.how}); {bound}"


def decoded_tokens(o: Outcome) -> tuple[int, ...]:
    """Every token the engine decoded for ``o``: the tap's steps when it computed more than the
    reply keeps (the claims check asks for extra decode steps, then cuts the reply back), else
    ``o.tokens``. The cache holds the KV of all of them, whatever the reply was cut to."""
    steps = o.claims.computed_steps if o.claims is not None else None
    if steps and len(steps) > len(o.tokens):
        return tuple(int(np.argmax(s)) for s in steps)
    return tuple(o.tokens)


def last_kv_of(engine: Engine, call: Call) -> LastKv:
    """The engine's declared ``last_token_kv``, else what :func:`probe_last_kv` measures on an
    engine whose reuse figures can answer it (its ``decode_kv_probe``: a server under the tap
    or with claims), else unknown."""
    declared = traits_of(engine).last_token_kv
    if declared is not None:
        if not isinstance(declared, bool):
            raise EngineError(f"last_token_kv={declared!r} is not a bool or None")
        return LastKv(declared, "declared by the engine: last_token_kv")
    if not traits_of(engine).decode_kv_probe:
        return LastKv(None, "not measured: the engine declares no last_token_kv and has no probe")
    try:
        return probe_last_kv(engine, call)
    except PrefixCacheError as exc:
        return LastKv(None, f"probe failed: {exc}")


#: Tokens the probe's requests ask for: two, so that the first request's rows end with a decode
#: step whether or not the last token is fed back. With one, a decode that never feeds it
#: leaves the prompt's prefill as its last row, and the next turn's prefill, resumed right
#: there, reads as that prefill's next chunk to a tap that cannot label rows (one track).
PROBE_TOKENS = 2


def _request(messages: Sequence[Message]) -> Request:
    return Request(tuple(messages), max_new_tokens=PROBE_TOKENS)


def probe_last_kv(engine: Engine, call: Call, prompts: Sequence[str] = PROBE_PROMPTS) -> LastKv:
    """Measure it (the module's docstring); the engine's cache is reset before each probe and
    after the last."""
    run = engine.run
    reset = engine.reset
    rows_of = optional_method(engine, "kv_computed")
    why: list[str] = []
    try:
        for text in prompts:
            call("engine.reset() before the decode-KV probe", reset)
            first_req = _request([Message("user", (text,))])
            first = call(
                "run(decode-KV probe, use_cache=True)",
                functools.partial(run, first_req, use_cache=True),
            )
            second = _second(run, call, first_req, first)
            answer = None
            if rows_of is not None and isinstance(first, Outcome):
                end = call("engine.kv_computed(decode-KV probe)", functools.partial(rows_of, first))
                answer = _from_rows(first, end, why)
            answer = answer or _judge(first, second, why)
            if answer is not None:
                return answer
    finally:
        call("engine.reset() after the decode-KV probe", reset)
    return LastKv(None, "probe inconclusive: " + "; ".join(dict.fromkeys(why)))


def _second(run: Callable[..., Outcome], call: Call, first_req: Request, first: object) -> object:
    if not isinstance(first, Outcome) or first.text is None or not first.tokens:
        return None
    req = _request(
        [
            *first_req.messages,
            Message("assistant", (first.text,)),
            Message("user", (PROBE_FOLLOW_UP,)),
        ]
    )
    return call(
        "run(decode-KV probe's next turn, use_cache=True)", lambda: run(req, use_cache=True)
    )


def _from_rows(first: Outcome, end: object, why: list[str]) -> LastKv | None:
    """The answer the model's rows for ``first`` give (``end``: the KV offset after its last
    row, from ``kv_computed``), or None (the reason appended to ``why``)."""
    if end is None:
        return None  # no observer saw it: the next turn's reuse may tell
    if not isinstance(end, int) or isinstance(end, bool):
        raise EngineError(f"kv_computed returned {end!r}, not an int or None")
    n = first.prompt_tokens if first.prompt_tokens is not None else len(first.token_ids or ())
    g = len(decoded_tokens(first))
    if not n or not g:
        why.append("the reply has no prompt length or no generated token")
        return None
    seen = (
        f"the model's rows for a {n}-token prompt and {g} generated token(s) end at KV offset {end}"
    )
    if end >= n + g:
        return LastKv(True, f"the tap: {seen}, the last generated token fed back")
    if end == n + g - 1:
        return LastKv(False, f"the tap: {seen}, the last generated token never fed back")
    why.append(f"{seen}: the tap missed decode steps")
    return None


def _judge(first: object, second: object, why: list[str]) -> LastKv | None:
    """The answer two probe requests give, or None (the reason appended to ``why``)."""
    if not isinstance(first, Outcome) or not isinstance(second, Outcome):
        why.append("the engine returned no reply text or tokens")
        return None
    if first.token_ids is None or second.token_ids is None:
        why.append("the engine reports no prompt token ids")
        return None
    if second.cached_tokens is None:
        why.append("the engine reports no reuse (cached_tokens)")
        return None
    prompt, out = tuple(first.token_ids), decoded_tokens(first)
    n, g, ids = len(prompt), len(out), tuple(second.token_ids)
    if ids[:n] != prompt or shared_prefix(ids[n:], out) < g:
        why.append("the next turn's prompt does not carry the reply's generated token ids")
        return None
    reused = second.cached_tokens
    seen = f"reused {reused} of the next turn's prompt after a {n}-token prompt and {g} token(s)"
    if reused > n + g:
        why.append(f"it reused more than the prompt and the reply it returned ({seen})")
        return None
    if reused == n + g:
        return LastKv(True, f"probed: {seen}")
    if reused == n + g - 1:
        return LastKv(False, f"probed: {seen}")
    why.append(f"the cache kept none of the reply ({seen})")
    return None
