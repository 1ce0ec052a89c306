"""The requests every engine's opt-in tests send, kept once as corpus files (stream files of
``pytest_prefixcache.output.streams``, in ``scenarios/``): a text prompt and its next turn, one
image request, and four image streams whose last request is the one judged (another image of
the same size, the same images swapped, a next turn, an exact repeat)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_prefixcache import Request
from pytest_prefixcache.output.streams import load_stream

__all__ = ["IMAGE", "IMAGE_STREAMS", "TEXT", "TEXT_NEXT", "image_streams", "stream"]

DIRECTORY = Path(__file__).resolve().parent / "scenarios"
#: The image streams, in the order (and with the ids) the opt-in tests parametrize them.
IMAGE_STREAMS = ("other-image-same-size", "swapped-order", "next-turn", "repeat")


def stream(name: str) -> tuple[Request, ...]:
    """The requests of scenario ``name``."""
    return load_stream(DIRECTORY / name / "stream.json")[0]


def image_streams() -> list[object]:
    """``pytest.param(history, final, id=name)`` for each of :data:`IMAGE_STREAMS`."""
    out: list[object] = []
    for name in IMAGE_STREAMS:
        *history, final = stream(name)
        out.append(pytest.param(history, final, id=name))
    return out


TEXT, TEXT_NEXT = stream("text-then-next-turn")
(IMAGE,) = stream("image")
