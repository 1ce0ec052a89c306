"""The moves request streams are made of, shared by the strategies and the state machine.

Each move takes a ``draw`` function (from ``st.composite`` or ``st.data()``) and returns a new
Request derived from earlier ones: a new conversation, an exact repeat, an append-only next
turn, an edit of an earlier turn (a branch), the same prompt with one image replaced by another
of the same size, swapped images, the same pixels from another container, or the same
conversation in another namespace, or with another adapter (``StreamSpec.adapters``: every
other move keeps its base's adapter; a new conversation draws one). Draws shrink toward short
text, no images, the first namespace, no adapter and ``max_new_tokens=0``.

In a closed-loop stream (``StreamSpec.closed_loop``) an ``append`` move's assistant turn is
not text the strategy wrote but a :class:`~pytest_prefixcache.types.ReplyOf` marker: the
engine's own greedy reply to the request it continues, filled in by the verifier at run
time; every request then asks for ``reply_tokens`` new tokens (shrinking toward the fewest).
A closed-loop stream whose moves left no assistant turn to fill ends with an ``append`` in
its last request's place (:func:`reply_back`), so that every one sends a reply back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st

from ..images import reencode
from ..types import Image, Message, ReplyOf, Request

__all__ = [
    "MOVES",
    "WORDS",
    "ReplySlot",
    "StreamSpec",
    "apply_move",
    "close_loop",
    "new_conversation",
    "reply_back",
]

Draw = Callable[[st.SearchStrategy[Any]], Any]

WORDS = (
    "describe the image",
    "what colour is it",
    "compare them",
    "and now",
    "list every object you see in detail",
    "extract the text",
    "thanks",
    "make it brighter",
    "which one is larger",
    "summarise our conversation so far",
)

#: Shared system prompts, long enough (hundreds of characters) that a correct cache reuses
#: whole blocks of them across conversations.
SYSTEM_PROMPTS = (
    "You are a careful visual assistant. Look at every image the user sends, describe what "
    "you see precisely, answer questions about colours, shapes, text and layout, and say so "
    "when you are not sure. Keep answers short and factual. Never invent details that are "
    "not visible in the images, and refer to images by their order in the conversation.",
    "You extract structured data from photos of documents and receipts. For each photo, "
    "return the merchant, the date, every line item with its price, the tax and the total "
    "as JSON. If a field is unreadable, use null. Photos may be rotated, cropped, or of "
    "different sizes; handle each one independently and never mix up two photos.",
)

#: Move names; the first ones are the simplest, so streams shrink toward them.
MOVES = ("repeat", "append", "new", "edit", "replace", "swap", "reencode", "namespace", "adapter")


@dataclass(frozen=True)
class StreamSpec:
    """The knobs of generated requests (validated by the public strategies)."""

    namespaces: tuple[str, ...] = ("", "tenant-b")
    max_new_tokens: int = 2
    max_images_per_message: int = 2
    system_prompts: tuple[str, ...] = SYSTEM_PROMPTS
    closed_loop: bool = False
    """``append`` sends the engine's own reply back (a ``ReplyOf`` marker) as the next
    assistant turn."""
    reply_tokens: tuple[int, int] = (2, 8)
    """Fewest and most new tokens per request of a closed-loop stream (its replies)."""
    defer_replies: bool = False
    """Write assistant turns as :class:`ReplySlot` texts, so that a stream drawn open-loop can
    be closed afterwards (:func:`close_loop`) with the same draws."""
    adapters: tuple[str, ...] = ()
    """Adapter names requests may carry besides none (``Request.adapter``); empty: none."""


class ReplySlot(str):
    """Written assistant text after stream request ``request``: :func:`close_loop` turns it
    into a ``ReplyOf(request)`` marker in a closed-loop stream, or plain text otherwise."""

    request: int

    def __new__(cls, text: str, request: int) -> ReplySlot:
        self = super().__new__(cls, text)
        self.request = request
        return self


def _text(draw: Draw) -> str:
    words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3))
    return ", ".join(words)


def user_message(
    draw: Draw, pool: Sequence[Image], spec: StreamSpec, images: int | None = None
) -> Message:
    """A user turn: text with up to ``max_images_per_message`` pool images, in drawn order."""
    if images is None:
        k = min(spec.max_images_per_message, len(pool))
        images = draw(st.integers(0, k)) if k else 0
    parts: list[str | Image] = [_text(draw)]
    for _ in range(images):
        img = pool[draw(st.integers(0, len(pool) - 1))]
        where = draw(st.integers(0, len(parts)))
        parts.insert(where, img)
    return Message("user", tuple(parts))


def new_conversation(
    draw: Draw, pool: Sequence[Image], spec: StreamSpec, turns: int = 1
) -> tuple[Message, ...]:
    """An optional shared system prompt, then ``turns`` user turns with assistant replies."""
    msgs: list[Message] = []
    sys_i = draw(st.integers(0, len(spec.system_prompts))) - 1  # shrinks to none
    if sys_i >= 0:
        msgs.append(Message("system", (spec.system_prompts[sys_i],)))
    for t in range(turns):
        if t:
            msgs.append(Message("assistant", (_text(draw),)))
        msgs.append(user_message(draw, pool, spec))
    return tuple(msgs)


def _pick(draw: Draw, stream: Sequence[Request]) -> int:
    # The latest request half of the time (and when shrinking), else any earlier one.
    back = max(0, draw(st.integers(-len(stream), len(stream) - 1)))
    return len(stream) - 1 - back


def _index_of(stream: Sequence[Request], base: Request) -> int | None:
    """The stream index of the latest request equal to ``base`` (None when it was not sent)."""
    for i in range(len(stream) - 1, -1, -1):
        if stream[i] == base:
            return i
    return None


def _assistant(draw: Draw, spec: StreamSpec, of: int | None) -> Message:
    """The assistant turn after request ``of``: its own reply in a closed-loop stream (when
    the request is known), else text the strategy writes."""
    if spec.closed_loop and of is not None:
        return Message("assistant", (ReplyOf(of),))
    text = _text(draw)
    if spec.defer_replies and of is not None:
        return Message("assistant", (ReplySlot(text, of),))
    return Message("assistant", (text,))


def close_loop(stream: Sequence[Request], closed: bool, spec: StreamSpec) -> tuple[Request, ...]:
    """A stream drawn with ``defer_replies``, finished: closed-loop (every :class:`ReplySlot`
    a ``ReplyOf`` marker, and each request's ``max_new_tokens`` mapped from ``[0,
    max_new_tokens]`` onto ``reply_tokens``) or open-loop (plain text, unchanged counts)."""
    lo, hi = spec.reply_tokens
    top = max(1, spec.max_new_tokens)
    memo: dict[int, Message] = {}

    def part(p: str | Image) -> str | Image:
        if isinstance(p, ReplySlot):
            return ReplyOf(p.request) if closed else str.__str__(p)
        return p

    def message(m: Message) -> Message:
        if id(m) not in memo:
            memo[id(m)] = Message(m.role, tuple(part(p) for p in m.content))
        return memo[id(m)]

    out = []
    for r in stream:
        n = lo + r.max_new_tokens * (hi - lo) // top if closed else r.max_new_tokens
        out.append(Request(tuple(message(m) for m in r.messages), r.namespace, n, r.adapter))
    return tuple(out)


def _carries_reply(request: Request) -> bool:
    return any(isinstance(p, (ReplyOf, ReplySlot)) for m in request.messages for p in m.content)


def reply_back(
    draw: Draw, stream: Sequence[Request], pool: Sequence[Image], spec: StreamSpec, longest: int
) -> tuple[Request, ...]:
    """A closed-loop stream with at least one reply sent back: unchanged when a request
    carries one (a ``ReplyOf`` marker or a :class:`ReplySlot`), else its last request replaced
    by an ``append`` on the request before it (the engine's reply, then a drawn user turn); a
    single request gets that ``append`` after it when ``longest`` allows two. In place rather
    than after: a failure that needs an assistant turn then shrinks to two requests, as an
    open-loop stream does (``new`` then ``append``), not to three."""
    keep = stream[:-1] if len(stream) > 1 else stream[: longest - 1]
    if not keep or any(_carries_reply(r) for r in stream):
        return tuple(stream)
    return (*keep, apply_move(draw, "append", keep, pool, spec, keep[-1]))


def _replace_images(req: Request, fn: Callable[[int, Image], Image]) -> tuple[Message, ...]:
    count = -1
    out = []
    for m in req.messages:
        parts: list[str | Image] = []
        for p in m.content:
            if isinstance(p, Image):
                count += 1
                parts.append(fn(count, p))
            else:
                parts.append(p)
        out.append(Message(m.role, tuple(parts)))
    return tuple(out)


def _edit(
    draw: Draw, base: Request, pool: Sequence[Image], spec: StreamSpec
) -> tuple[Message, ...]:
    users = [i for i, m in enumerate(base.messages) if m.role == "user"]
    k = users[draw(st.integers(0, len(users) - 1))]
    old = base.messages[k]
    imgs = [p for p in old.content if isinstance(p, Image)]
    if imgs and draw(st.booleans()):
        # Another image of the same size where possible: identical placeholder counts.
        target = imgs[draw(st.integers(0, len(imgs) - 1))]
        same = [p for p in pool if p.size == target.size and p != target]
        others = same or [p for p in pool if p != target] or [target]
        new = others[draw(st.integers(0, len(others) - 1))]
        parts = tuple(new if p is target else p for p in old.content)
        edited = Message("user", parts)
    else:
        edited = user_message(draw, pool, spec, images=len(imgs))
    return (*base.messages[:k], edited)


def apply_move(
    draw: Draw,
    move: str,
    stream: Sequence[Request],
    pool: Sequence[Image],
    spec: StreamSpec,
    base: Request | None = None,
) -> Request:
    """The next request of a stream, made by ``move`` from ``base`` (default: drawn from the
    requests before it, the latest first). It keeps ``base``'s adapter, but for ``new`` (one
    drawn from ``spec.adapters``, when any) and ``adapter`` (the same request with another)."""
    if (not stream and base is None) or move == "new":
        made = _apply(draw, "new", stream, pool, spec, base)
        if not spec.adapters:
            return made
        return replace(made, adapter=draw(st.sampled_from((None, *spec.adapters))))
    index = None
    if base is None:
        index = _pick(draw, stream)
        base = stream[index]
    if move == "adapter":
        others = [a for a in (None, *spec.adapters) if a != base.adapter] or [base.adapter]
        return replace(base, adapter=others[draw(st.integers(0, len(others) - 1))])
    made = _apply(draw, move, stream, pool, spec, base, index)
    return made if made.adapter == base.adapter else replace(made, adapter=base.adapter)


def _apply(
    draw: Draw,
    move: str,
    stream: Sequence[Request],
    pool: Sequence[Image],
    spec: StreamSpec,
    base: Request | None = None,
    picked: int | None = None,
) -> Request:
    lo, hi = spec.reply_tokens if spec.closed_loop else (0, spec.max_new_tokens)
    mnt = st.integers(lo, hi)
    if (not stream and base is None) or move == "new":
        ns = draw(st.sampled_from(spec.namespaces))
        return Request(new_conversation(draw, pool, spec), ns, draw(mnt))
    index: int | None
    if base is None:
        index = _pick(draw, stream)
        base = stream[index]
    else:
        index = _index_of(stream, base) if picked is None else picked
    if move == "repeat":
        return base
    if move == "append":
        reply = _assistant(draw, spec, index)
        msgs = (*base.messages, reply, user_message(draw, pool, spec))
        return Request(msgs, base.namespace, draw(mnt))
    if move == "edit":
        return Request(_edit(draw, base, pool, spec), base.namespace, draw(mnt))
    if move == "replace":
        # The same prompt with one image replaced by a distinct one of the same size where
        # possible: identical placeholder tokens, different pixels (the collision case).
        imgs = base.images
        if not imgs:
            return Request(_edit(draw, base, pool, spec), base.namespace, draw(mnt))
        k = draw(st.integers(0, len(imgs) - 1))
        same = [p for p in pool if p.size == imgs[k].size and p != imgs[k]]
        others = same or [p for p in pool if p != imgs[k]] or [imgs[k]]
        new = others[draw(st.integers(0, len(others) - 1))]
        msgs = _replace_images(base, lambda i, img: new if i == k else img)
        return Request(msgs, base.namespace, base.max_new_tokens)
    if move == "swap":
        imgs = base.images
        if len(set(imgs)) < 2:
            if spec.max_images_per_message == 0:  # nothing to swap in a text-only stream
                return apply_move(draw, "append", stream, pool, spec, base)
            one, two = pool[0], pool[1 % len(pool)]
            rest = (
                base.messages
                if base.messages[-1].role != "user"
                else (*base.messages, _assistant(draw, spec, index))
            )
            if spec.max_images_per_message >= 2:
                extra: tuple[Message, ...] = (Message("user", (_text(draw), one, two)),)
            else:  # one image a message: the two in consecutive user turns
                reply = Message("assistant", (_text(draw),))
                extra = (
                    Message("user", (_text(draw), one)),
                    reply,
                    Message("user", (_text(draw), two)),
                )
            return Request((*rest, *extra), base.namespace, base.max_new_tokens)
        a = 0
        b = next(i for i, img in enumerate(imgs) if img != imgs[0])
        order = list(imgs)
        order[a], order[b] = order[b], order[a]
        return Request(
            _replace_images(base, lambda i, _: order[i]), base.namespace, base.max_new_tokens
        )
    if move == "reencode":
        if not base.images:
            return base
        fmt = draw(st.sampled_from(("BMP", "PNG")))
        return Request(
            _replace_images(base, lambda i, img: reencode(img, fmt)),
            base.namespace,
            base.max_new_tokens,
        )
    if move == "namespace":
        names = [ns for ns in spec.namespaces if ns != base.namespace] or [base.namespace]
        ns = names[draw(st.integers(0, len(names) - 1))]
        return Request(base.messages, ns, base.max_new_tokens)
    raise ValueError(f"unknown move {move!r}; expected one of {', '.join(MOVES)}")
