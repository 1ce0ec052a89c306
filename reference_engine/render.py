"""Rendering a Request into token ids and image spans with the processor's chat template.

The chat template renders each image as one image-pad token; each pad is then expanded to the
image's placeholder count (from its patch grid) and the whole text is tokenised at once, as
the model's own processor does. The image spans are read back from the token ids and checked
against the images, so a template that drops or duplicates an image is an error, not a
silent mismatch.

Where each message begins (``Rendered.message_starts``, the boundaries a snapshot cache
resumes at): message k begins where the rendering of the messages before it ends, when that
rendering is a prefix of the whole text (a template that renders earlier turns differently
once more follow, or refuses a partial conversation, tells no start there); the first
message at 0 (a template's preamble, a BOS or a default system prompt, counts as part of it).
The text between two starts is tokenised on its own, and a start is reported only while the
pieces' ids add up to the prompt's: a start is then a token boundary of the prompt. With
ChatML each start is the position of an ``<|im_start|>``; a template that merges the system
text into the first user turn (Gemma) tells fewer starts.

System prompts are normalised first: lines that change on every request without changing the
conversation (``x-anthropic-billing-header: cc_version=...; cch=...;``, which Claude Code puts
in its system prompt; vllm-mlx #90, b9f2a5f) are removed, or they would defeat prefix reuse.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_prefixcache.errors import EngineError
from pytest_prefixcache.types import Image, Request

from .blocks import ImageSpan

__all__ = [
    "VOLATILE_LINE",
    "Rendered",
    "find_spans",
    "message_starts",
    "normalize_system",
    "render",
    "to_chat_messages",
]

#: A system-prompt line that varies per request but carries no meaning for the model.
VOLATILE_LINE = re.compile(r"^[ \t]*x-anthropic-billing-header:[^\n]*(?:\n|$)", re.I | re.M)


@dataclass(frozen=True)
class Rendered:
    """A request as the model sees it."""

    token_ids: tuple[int, ...]
    spans: tuple[ImageSpan, ...]
    images: tuple[Image, ...]
    message_starts: tuple[int, ...] | None = None
    """Positions in ``token_ids`` where a message begins (see the module), ascending."""
    boundaries: tuple[int, ...] | None = None
    """Where the prefill is cut on a model with non-trimmable layers (``snapshots.boundaries``),
    found once by the engine; None: not looked for."""


def normalize_system(text: str) -> str:
    """``text`` without volatile header lines (see ``VOLATILE_LINE``)."""
    return VOLATILE_LINE.sub("", text)


def to_chat_messages(request: Request, *, normalize: bool = True) -> list[dict[str, Any]]:
    """The request as Hugging Face chat messages with typed content parts; with ``normalize``
    (the default), system prompts lose their volatile header lines."""
    messages = []
    for m in request.messages:
        strip = normalize and m.role == "system"
        parts: list[dict[str, Any]] = [
            {"type": "image"}
            if isinstance(p, Image)
            else {"type": "text", "text": normalize_system(p) if strip else p}
            for p in m.content
        ]
        messages.append({"role": m.role, "content": parts})
    return messages


def find_spans(token_ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """Maximal runs [start, end) of ``image_token_id`` in ``token_ids``."""
    spans: list[tuple[int, int]] = []
    start = None
    for i, t in enumerate(token_ids):
        if t == image_token_id and start is None:
            start = i
        elif t != image_token_id and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(token_ids)))
    return spans


def render(
    request: Request,
    *,
    processor: Any,
    image_token_id: int,
    placeholder_count: Callable[[Image], int],
    normalize: bool = True,
    encode: Callable[[str], Sequence[int]] | None = None,
    template: bool = True,
    marker: str | None = None,
    expand: Callable[[int], str] | None = None,
) -> Rendered:
    """Token ids and image spans of ``request``; ``placeholder_count`` sizes each image;
    ``normalize`` removes volatile header lines from system prompts; ``encode`` tokenises the
    text (default: the tokenizer, on the whole text); ``template=False`` takes the messages'
    text as it is, without the chat template (a plain completion prompt). ``marker`` is what
    the template writes for one image (default: the image token itself) and ``expand(n)`` the
    text it becomes for an image of n placeholders (default: n image tokens); Gemma writes
    ``<start_of_image>`` and expands it around its soft tokens."""
    tokenizer = getattr(processor, "tokenizer", processor)
    pad = tokenizer.convert_ids_to_tokens(image_token_id)
    marker = pad if marker is None else marker
    add_generation_prompt = request.messages[-1].role != "assistant"
    template_owner = processor if getattr(processor, "chat_template", None) else tokenizer
    if template:
        chat = to_chat_messages(request, normalize=normalize)
        text = template_owner.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        starts = _template_starts(template_owner, chat, text)
    else:
        texts = ["".join(p for p in m.content if isinstance(p, str)) for m in request.messages]
        text = "".join(texts)
        starts = list(itertools.accumulate(len(t) for t in texts[:-1]))
    images = request.images
    if text.count(marker) != len(images):
        raise EngineError(
            f"the chat template rendered {text.count(marker)} image markers {marker!r} for "
            f"{len(images)} images"
        )
    pieces = text.split(marker)
    expanded = [pieces[0]]
    for image, piece in zip(images, pieces[1:]):
        count = placeholder_count(image)
        expanded.append(pad * count if expand is None else expand(count))
        expanded.append(piece)
    if encode is None:
        encode_many = lambda ts: tokenizer(ts, add_special_tokens=False)["input_ids"]  # noqa: E731
    else:
        encode_many = lambda ts: [encode(t) for t in ts]  # noqa: E731
    full = "".join(expanded)
    token_ids = tuple(int(t) for t in encode_many([full])[0])
    grown = _expanded_offsets(starts, pieces, [len(p) for p in expanded[1::2]], len(marker))
    runs = find_spans(token_ids, image_token_id)
    if len(runs) != len(images):
        raise EngineError(
            f"found {len(runs)} image placeholder runs in the token ids for {len(images)} images "
            f"(are two images rendered without a separator?)"
        )
    spans = []
    for i, ((start, end), image) in enumerate(zip(runs, images)):
        want = placeholder_count(image)
        if end - start != want:
            raise EngineError(
                f"image {i} ({image!r}) has {end - start} placeholder tokens, expected {want}"
            )
        spans.append((start, end, image.digest))
    starts_ids = message_starts(token_ids, full, grown, encode_many)
    return Rendered(token_ids, tuple(spans), images, starts_ids)


def _template_starts(owner: Any, chat: list[dict[str, Any]], text: str) -> list[int]:
    """Character offsets in ``text`` where a message begins (see the module)."""
    starts = [0]
    for k in range(1, len(chat)):
        try:
            head = owner.apply_chat_template(chat[:k], tokenize=False, add_generation_prompt=False)
        except Exception:  # a template may refuse a partial conversation: no start there
            continue
        if isinstance(head, str) and len(head) > starts[-1] and text.startswith(head):
            starts.append(len(head))
    return starts


def _expanded_offsets(
    starts: Sequence[int], pieces: Sequence[str], runs: Sequence[int], pad: int
) -> list[int]:
    """``starts`` (offsets in the text with one pad per image) as offsets in the text whose
    pads are expanded to ``runs`` characters each."""
    out, shift, end, i = [], 0, len(pieces[0]), 0
    for c in starts:
        while i < len(runs) and c > end:  # past image i's pad: the run is longer than it
            shift += runs[i] - pad
            end += pad + len(pieces[i + 1])
            i += 1
        out.append(c + shift)
    return out


def message_starts(
    token_ids: Sequence[int],
    text: str,
    starts: Sequence[int],
    encode_many: Callable[[list[str]], Sequence[Sequence[int]]],
) -> tuple[int, ...]:
    """Token positions of the character offsets ``starts`` of ``text``: the text between two
    offsets is tokenised on its own (``encode_many`` tokenises a list of texts); an offset is
    a token boundary of ``token_ids`` while the pieces' ids so far are its prefix (the first
    that is not ends the list)."""
    cuts = sorted({c for c in starts if 0 < c < len(text)})
    pieces = encode_many([text[a:b] for a, b in zip([0, *cuts], cuts)]) if cuts else []
    out, pos = [0], 0
    for ids in pieces:
        ids = tuple(int(t) for t in ids)
        if tuple(token_ids[pos : pos + len(ids)]) != ids:
            break
        pos += len(ids)
        if out[-1] < pos < len(token_ids):
            out.append(pos)
    return tuple(out) if token_ids else ()
