"""Failure messages that read like bug reports: what broke, where, and how to replay it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..checks.oracle import Match, source_name
from ..checks.problem import Problem
from ..checks.protocol import span_at
from ..types import Image, Outcome, Request

__all__ = ["Context", "describe_request", "format_failure"]

MAX_STREAM_LINES = 12


def _text(s: str, limit: int = 40) -> str:
    s = " ".join(s.split())
    return repr(s if len(s) <= limit else s[: limit - 3] + "...")


def describe_request(req: Request, max_messages: int = 5) -> str:
    """One line: namespace, max_new_tokens and the messages' parts, abbreviated (the first
    message and the last ``max_messages - 1`` when there are more)."""
    msgs = []
    shown = list(req.messages)
    if len(shown) > max_messages:
        skipped = len(shown) - max_messages
        shown = [shown[0], *shown[-(max_messages - 1) :]]
    for i, m in enumerate(shown):
        if i == 1 and len(shown) < len(req.messages):
            msgs.append(f"({skipped} more messages)")
        parts = [
            f"[image {p.size[0]}x{p.size[1]} {p.digest[:12]}]" if isinstance(p, Image) else _text(p)
            for p in m.content
        ]
        msgs.append(f"{m.role}: " + " ".join(parts))
    head = f"namespace={req.namespace!r}, max_new_tokens={req.max_new_tokens}"
    if req.adapter is not None:
        head += f", adapter={req.adapter!r}"
    return head + " | " + " | ".join(msgs)


@dataclass(frozen=True)
class Context:
    """Where a problem was found."""

    stream: Sequence[Request]
    index: int | None = None
    cached: Outcome | None = None
    match: Match | None = None
    replay: str | None = None


def _involved_span(problem: Problem, ctx: Context) -> tuple[int, int, str] | None:
    o = ctx.cached
    if o is None or not o.image_spans:
        return None
    cached = o.cached_tokens or 0
    if problem.position is not None:
        pos = problem.position
    elif ctx.match is not None and ctx.match.exceeded_by(cached):
        pos = ctx.match.limit
    else:
        pos = cached
    for p in (pos, pos - 1):
        for s in o.image_spans:
            if s[0] <= p < s[1]:
                return s
    return span_at(o.image_spans, pos) if cached else None


def _named(problem: Problem) -> bool:
    """The problem's own lines already name every reference."""
    return any(d.startswith("reuse references: ") for d in problem.details)


def format_failure(problem: Problem, ctx: Context, others: Sequence[Problem] = ()) -> str:
    """The whole message for one problem found in a stream."""
    n = len(ctx.stream)
    where = (
        f"request {ctx.index} of a stream of {n} (counting from 0)"
        if ctx.index is not None
        else f"a stream of {n} request(s)"
    )
    lines = [f"{problem.check}: {problem.headline}", f"  at {where}"]
    lines += [f"  {d}" for d in problem.details]
    o = ctx.cached
    if o is not None:
        reuse = f"  cached_tokens={o.cached_tokens} of prompt_tokens={o.prompt_tokens}"
        if ctx.match is not None:
            src = (
                f", shared with {source_name(ctx.match.source)}"
                if ctx.match.source is not None
                else f" (no earlier request in namespace {ctx.stream[ctx.index or 0].namespace!r}"
                " shares a prefix)"
            )
            reuse += f"; oracle maximum valid reuse {ctx.match.max_reuse}{src}"
        lines.append(reuse)
        if ctx.match is not None and ctx.match.snapshot is not None and not _named(problem):
            lines.append(f"  {ctx.match.references()}")
        start = None if ctx.match is None else ctx.match.decode_start
        if start is not None and (o.cached_tokens or 0) > start:
            lines.append(
                f"  positions from {start} on continue an earlier request's own reply: their "
                "reused KV may have been computed while decoding"
            )
        span = _involved_span(problem, ctx)
        if span is not None:
            k = list(o.image_spans or ()).index(span)
            lines.append(
                f"  image span involved: [{span[0]}, {span[1]}) digest {span[2][:12]} "
                f"(image {k} of {len(o.image_spans or ())}, {span[1] - span[0]} placeholders)"
            )
    for extra in others:
        lines.append(f"  also ({extra.check}): {extra.headline}")
    lines.append("  stream:")
    shown = list(enumerate(ctx.stream))
    if len(shown) > MAX_STREAM_LINES:
        shown = shown[: MAX_STREAM_LINES // 2] + shown[-MAX_STREAM_LINES // 2 :]
    prev = -1
    for i, req in shown:
        if i != prev + 1:
            lines.append("    ...")
        mark = ">" if i == ctx.index else " "
        lines.append(f"   {mark}[{i}] {describe_request(req)}")
        prev = i
    if ctx.replay:
        lines.append(f"  replay: {ctx.replay}")
    return "\n".join(lines)
