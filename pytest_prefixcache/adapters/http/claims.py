"""Reading an engine's claims around each request (the claims check).

An HTTP engine declares where its server reports reuse with
``OpenAIEngine(claims=ClaimWatch([...]))`` (the sources: :mod:`.claim_sources`).
:meth:`ClaimWatch.start` reads the before-figures and, when the tap is on, asks for
``decode_steps`` generated tokens (so that per-step alignment has steps to align);
:meth:`Pending.finish` reads the after-figures and the API's per-step logprobs, puts them with
what the tap saw into :attr:`Outcome.claims`, and cuts the Outcome back to the request's
``max_new_tokens``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import EngineError
from ...types import Claim, Claims, Outcome, Request, StepEntry
from .claim_sources import (
    UNITS,
    ApiField,
    Header,
    LogPattern,
    MetricDelta,
    Source,
    StatsDelta,
    dotted,
    excerpt,
    metric_sum,
    number,
    sources_from_json,
    sources_from_specs,
)
from .server import ServerProcess, http_json

__all__ = [
    "ApiField",
    "ClaimWatch",
    "Header",
    "LogPattern",
    "MetricDelta",
    "Pending",
    "Source",
    "StatsDelta",
    "api_steps",
    "sources_from_json",
    "sources_from_specs",
]

#: Names a top_logprobs entry's token id when the entry carries none (a Vocabulary).
Identify = Callable[[Mapping[str, Any]], "int | None"]
#: The Outcome's per-generated-token fields, cut back to the request's ``max_new_tokens``.
_PER_STEP = ("tokens", "step_logits", "step_top_logprobs")


def api_steps(
    reply: Any, identify: Identify | None = None
) -> tuple[tuple[StepEntry, ...], ...] | None:
    """The API's distribution per decode step (``logprobs.content[i].top_logprobs``, or the
    step's own entry when it has none); None when the reply has no per-step logprobs. An
    entry's id is its ``id``, a ``token_id:N`` token, or what ``identify`` says; a logprob
    that is not a number (null, absent) is NaN, for the check to name."""
    try:
        content = (reply["choices"][0].get("logprobs") or {}).get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    if not content:
        return None
    out = []
    for step in content:
        entries = step.get("top_logprobs") or [step]
        out.append(tuple(_entry(e, identify) for e in entries if isinstance(e, Mapping)))
    return tuple(out)


def _entry(e: Mapping[str, Any], identify: Identify | None) -> StepEntry:
    token = e.get("token")
    tid = e.get("id")
    if tid is None and isinstance(token, str) and token.startswith("token_id:"):
        tid = number(token[len("token_id:") :])
    if tid is None and identify is not None:
        tid = identify(e)
    text = token if isinstance(token, str) else str(e.get("bytes", ""))
    lp = e.get("logprob")
    value = float(lp) if isinstance(lp, (int, float)) and not isinstance(lp, bool) else math.nan
    return StepEntry(value, None if tid is None else int(tid), text)


class ClaimWatch:
    """The claim sources an engine declares, and how many tokens to ask for with the tap.

    Args:
        sources: where the server reports reuse (see the module docstring).
        decode_steps: tokens asked for when the tap is on, whatever the request asks for (the
            Outcome keeps the request's ``max_new_tokens``). Default: ``8``.
        timeout: seconds per stats or metrics read. Default: ``30``.
        log_settle: seconds a log source waits for the log to stop growing. Default: ``0.05``.
    """

    def __init__(
        self,
        sources: Sequence[Source] = (ApiField(),),
        *,
        decode_steps: int = 8,
        timeout: float = 30.0,
        log_settle: float = 0.05,
    ) -> None:
        for s in sources:
            if s.unit not in UNITS:
                raise EngineError(f"claim source {s.name}: unit {s.unit!r} is not one of {UNITS}")
            if isinstance(s, LogPattern):
                re.compile(s.pattern)
        self.sources = tuple(sources)
        self.decode_steps = decode_steps
        self.timeout = timeout
        self.log_settle = log_settle
        self._lock = threading.Lock()
        self._active: dict[str, set[Pending]] = {}
        """The requests under watch per server: a figure read around one request while
        another is in flight on the same server is not that request's alone."""

    def start(self, target: ServerProcess | str | None, request: Request, *, tap: bool) -> Pending:
        """Read the before-figures of ``target`` (a server started here, or a URL)."""
        base = target.url if isinstance(target, ServerProcess) else str(target).rstrip("/")
        log = target.log_path if isinstance(target, ServerProcess) else None
        pending = Pending(self, base, request, tap)
        with self._lock:
            active = self._active.setdefault(base, set())
            if active:  # every request in flight shares its figures with the others
                pending.shared = True
                for other in active:
                    other.shared = True
            active.add(pending)
        for s in self.sources:
            if isinstance(s, (StatsDelta, MetricDelta)):
                pending.before[s] = self._read(base, s)[0]
            elif isinstance(s, LogPattern):
                path = s.path or (None if log is None else os.fspath(log))
                if path is None:
                    raise EngineError(f"claim source {s.name}: no log file (give path=)")
                pending.before[s] = (path, _size(path))
        return pending

    def _read(self, base: str, s: StatsDelta | MetricDelta) -> tuple[float | None, str]:
        """(figure, raw text) of a stats or metrics source now; None: an optional field is
        absent, or the metric has no sample."""
        method = s.method if isinstance(s, StatsDelta) else "GET"
        try:
            status, body = http_json(method, base + s.path, timeout=self.timeout)
        except OSError as exc:
            raise EngineError(f"claim source {s.name}: {base}{s.path}: {exc}") from exc
        if status != 200:
            raise EngineError(f"claim source {s.name}: {base}{s.path} answered {status}")
        if isinstance(s, MetricDelta):
            text = body if isinstance(body, str) else str(body)
            return metric_sum(text, s.metric, s.labels), text
        value = number(dotted(body, s.field))
        if value is None and s.optional:
            return None, str(body)
        if value is None:
            raise EngineError(f"claim source {s.name}: no number at {s.field}: {str(body)[:300]}")
        return float(value), str(body)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class Pending:
    """One request under watch: started by :meth:`ClaimWatch.start`, ended by :meth:`finish`."""

    def __init__(self, watch: ClaimWatch, base: str, request: Request, tap: bool) -> None:
        self.watch = watch
        self.base = base
        self.original = request
        self.tap = tap
        self.before: dict[Source, Any] = {}
        self.headers: dict[str, str] = {}
        """The reply's headers: pass as ``http_json(..., response_headers=pending.headers)``."""
        n = max(request.max_new_tokens, watch.decode_steps) if tap else request.max_new_tokens
        self.request = dataclasses.replace(request, max_new_tokens=n)
        """The request to send: with the tap, ``decode_steps`` tokens."""
        self.shared = False
        """Another request was in flight on the server meanwhile (stats, metrics and log
        figures then claim nothing for this one)."""

    def done(self) -> None:
        """No longer in flight (:meth:`finish` calls it)."""
        with self.watch._lock:
            self.watch._active.get(self.base, set()).discard(self)

    def finish(self, out: Outcome, reply: Any, identify: Identify | None = None) -> Outcome:
        """``out`` (tapped when the tap is on) with :attr:`Outcome.claims`, cut back to the
        request's ``max_new_tokens``."""
        try:
            return self._finish(out, reply, identify)
        finally:
            self.done()

    def _finish(self, out: Outcome, reply: Any, identify: Identify | None) -> Outcome:
        claims = Claims(
            reuse=tuple(self._claim(s, reply) for s in self.watch.sources),
            steps=api_steps(reply, identify),
            reused=out.cached_tokens if self.tap else None,
            prompt_tokens=out.prompt_tokens,
            computed_steps=tuple(out.step_logits) if self.tap else None,
        )
        n = self.original.max_new_tokens
        cut = {
            f.name: getattr(out, f.name)[:n] for f in dataclasses.fields(out) if f.name in _PER_STEP
        }
        return dataclasses.replace(out, claims=claims, **cut)

    def _claim(self, s: Source, reply: Any) -> Claim:
        if isinstance(s, ApiField):
            raw = dotted(reply, s.path)
            return Claim(s.name, s.unit, number(raw), repr(raw))
        if isinstance(s, Header):
            text = self.headers.get(s.header.lower())
            return Claim(s.name, s.unit, None if text is None else number(text), repr(text))
        if self.shared:
            raw = "not this request's alone: another request was in flight on the server"
            return Claim(s.name, s.unit, None, raw)
        if isinstance(s, LogPattern):
            return self._log_claim(s)
        before = self.before[s]
        after, raw_after = self.watch._read(self.base, s)
        what = s.field if isinstance(s, StatsDelta) else s.name
        if isinstance(s, MetricDelta) and before is None and after is not None:
            before = 0.0  # the counter's first sample: it starts at 0
        if before is None or after is None:
            return Claim(s.name, s.unit, None, f"no {what}: {excerpt(raw_after, s)}")
        raw = f"{what} {before:g} -> {after:g}; after: {excerpt(raw_after, s)}"
        return Claim(s.name, s.unit, round(after - before), raw)

    def _log_claim(self, s: LogPattern) -> Claim:
        path, start = self.before[s]
        size, deadline = -1, time.monotonic() + 10 * self.watch.log_settle
        while time.monotonic() < deadline:  # let lines written just after the reply land
            now = _size(path)
            if now == size:
                break
            size = now
            time.sleep(self.watch.log_settle)
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        pattern = re.compile(s.pattern)
        lines = [line for line in text.splitlines() if pattern.search(line)]
        total = 0
        for line in lines:
            m = pattern.search(line)
            assert m is not None
            total += (number(m.group(1)) or 0) if pattern.groups else 1
        seen = len(text.splitlines())
        raw = " | ".join(lines[-3:]) if lines else f"no matching line among {seen} new line(s)"
        return Claim(s.name, s.unit, total, raw)
