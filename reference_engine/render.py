"""Rendering a Request into token ids and image spans with the processor's chat template.

The chat template renders each image as one image-pad token; each pad is then expanded to the
image's placeholder count (from its patch grid) and the whole text is tokenised at once, as
the model's own processor does. The image spans are read back from the token ids and checked
against the images, so a template that drops or duplicates an image is an error, not a
silent mismatch.

System prompts are normalised first: lines that change on every request without changing the
conversation (``x-anthropic-billing-header: cc_version=...; cch=...;``, which Claude Code puts
in its system prompt; vllm-mlx #90, b9f2a5f) are removed, or they would defeat prefix reuse.
"""

from __future__ import annotations

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
        text = template_owner.apply_chat_template(
            to_chat_messages(request, normalize=normalize),
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
    else:
        text = "".join(p for m in request.messages for p in m.content if isinstance(p, str))
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
        encode = lambda t: tokenizer(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    token_ids = tuple(int(t) for t in encode("".join(expanded)))
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
    return Rendered(token_ids, tuple(spans), images)
