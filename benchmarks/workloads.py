"""The benchmark workloads, defined once and shared by every engine: deterministic and seeded.

Each workload is a list of requests fed in order to one engine (cache reset before the first).
``workloads(size)`` builds all four for a size: ``"tiny"`` (the tiny fixture, prompts up to about
5,000 tokens) or ``"large"`` (the same shapes, fewer turns and shorter prompts, so that cold
prefills on the random hidden-512 model keep the whole run well under 15 minutes).

- ``agentic_loop`` (text only): a long system prompt, then a conversation that grows by one
  tool call, tool result and reply per turn; every request re-sends the whole history.
- ``multimodal_agent``: text turns; a new screenshot every third turn, and two turns that
  re-attach an earlier screenshot; the whole history (images included) is re-sent.
- ``photo_extraction``: one shared system prompt, then one unique photo per request, photos of
  different sizes (different placeholder counts); nothing after the image is shared.
- ``image_edit``: the oMLX #637 A-E conversation (an edit instruction and a new version of the
  picture per turn), then the full A-E conversation again with image 2 (B) replaced by a
  different picture of the same size: reusable only up to B.

``family_workloads()`` builds four more for the model families with layers that cannot be
trimmed (hybrid recurrent, sliding window; ``families_side_by_side.py``). Every prompt is longer
than the fixtures' 32-token window and has several boundaries (message starts, image edges)
where such a cache can hold a snapshot:

- ``growing_chat`` (text only): each request re-sends the history plus one user turn.
- ``shared_system`` (text only): one long shared system prompt, then a new user message per
  request.
- ``replaced_image``: a three-turn image conversation grown turn by turn, then re-sent with
  its second image replaced by another picture of the same size.
- ``swapped_images``: a text turn, then a turn with two images; the same conversation with the
  two images in the other order; then that one grown by a turn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pytest_prefixcache import Image, Message, Request

__all__ = ["SIZES", "Shape", "Workload", "family_workloads", "workloads"]

WORDS = (
    "agent tool file read write search patch test build error trace line module class function "
    "value config path index cache block token image prompt server client request reply update "
    "check plan step result output input stream buffer queue worker thread lock state memory "
    "disk network retry limit budget report summary detail review commit branch merge diff"
).split()


@dataclass(frozen=True)
class Shape:
    """How big one size of the workloads is."""

    system_words: int
    agent_turns: int
    turn_words: int
    mm_turns: int
    photos: int
    edit_side: int


SIZES = {
    "tiny": Shape(system_words=600, agent_turns=6, turn_words=80, mm_turns=8, photos=6,
                  edit_side=128),
    "large": Shape(system_words=80, agent_turns=4, turn_words=20, mm_turns=4, photos=3,
                   edit_side=48),
}  # fmt: skip


@dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[Request, ...]
    multimodal: bool


def text(rng: np.random.Generator, words: int) -> str:
    """``words`` seeded pseudo-words with some digits, as an agent transcript would have."""
    picks = rng.choice(len(WORDS), size=words)
    nums = rng.integers(0, 1000, size=words)
    return " ".join(
        f"{WORDS[p]}{n}" if n % 5 == 0 else WORDS[p] for p, n in zip(picks, nums, strict=True)
    )


def photo(seed: int, width: int, height: int) -> Image:
    """A smooth seeded picture (a gradient with noise), ``width`` x ``height`` pixels."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = rng.integers(0, 256, size=3)
    grad = (x * rng.integers(1, 4) + y * rng.integers(1, 4))[..., None] + base
    noise = rng.integers(0, 32, size=(height, width, 3))
    return Image(((grad + noise) % 256).astype(np.uint8))


def agentic_loop(shape: Shape, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    rules = text(rng, shape.system_words)
    system = Message("system", (f"You are a coding agent. Rules and tools: {rules}",))
    history: list[Message] = [system]
    requests = []
    for t in range(shape.agent_turns):
        history.append(Message("user", (f"Tool result {t}: {text(rng, shape.turn_words)}",)))
        requests.append(Request(tuple(history)))
        history.append(Message("assistant", (f"Call {t}: {text(rng, shape.turn_words // 4)}",)))
    return Workload("agentic_loop", tuple(requests), multimodal=False)


def multimodal_agent(shape: Shape, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    system = Message("system", (f"You operate a desktop. {text(rng, shape.system_words // 2)}",))
    history: list[Message] = [system]
    shots: list[Image] = []
    sizes = [(128, 96), (96, 128), (112, 112), (128, 64)]
    requests = []
    for t in range(shape.mm_turns):
        parts: list[str | Image] = [f"Step {t}: {text(rng, shape.turn_words)}"]
        if t % 3 == 0:
            w, h = sizes[len(shots) % len(sizes)]
            shots.append(photo(seed * 100 + t, w, h))
            parts.append(shots[-1])
        elif t % 3 == 2 and len(shots) > 1:  # re-attach an earlier screenshot
            parts.append(shots[0] if t % 2 else shots[len(shots) - 2])
            parts.append("Compare with this earlier screenshot.")
        history.append(Message("user", tuple(parts)))
        requests.append(Request(tuple(history)))
        history.append(Message("assistant", (f"Action {t}: {text(rng, shape.turn_words // 4)}",)))
    return Workload("multimodal_agent", tuple(requests), multimodal=True)


def photo_extraction(shape: Shape, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    system = Message(
        "system",
        (f"Extract the receipt fields as JSON. Schema: {text(rng, shape.system_words // 2)}",),
    )
    sizes = [(64, 64), (96, 48), (128, 128), (48, 80), (100, 100), (200, 100), (80, 80), (128, 64)]
    requests = []
    for i in range(shape.photos):
        w, h = sizes[i % len(sizes)]
        user = Message("user", (photo(seed * 100 + i, w, h), "Extract the fields of this photo."))
        requests.append(Request((system, user)))
    return Workload("photo_extraction", tuple(requests), multimodal=True)


def image_edit(shape: Shape, seed: int) -> Workload:
    side = shape.edit_side
    pics = {n: photo(seed * 100 + i, side, side) for i, n in enumerate("ABCDE")}
    changed_b = photo(seed * 100 + 99, side, side)
    asks = ["make the sky bluer", "add a red car on the left", "remove the tree",
            "warm the colours", "crop to the car"]  # fmt: skip
    system = Message(
        "system",
        ("You are an image editing assistant. The user sends a picture and an instruction; "
         "describe the edit you would make and keep track of every version of the picture.",),
    )  # fmt: skip

    def conversation(names: str, b: Image) -> Request:
        history: list[Message] = [system]
        for i, n in enumerate(names):
            if i:
                history.append(Message("assistant", (f"Here is version {n}: edit applied.",)))
            history.append(Message("user", (b if n == "B" else pics[n], asks[i])))
        return Request(tuple(history))

    requests = [conversation("ABCDE"[: k + 1], pics["B"]) for k in range(5)]
    requests.append(conversation("ABCDE", changed_b))
    return Workload("image_edit", tuple(requests), multimodal=True)


def growing_chat(seed: int, turns: int = 6, words: int = 40) -> Workload:
    rng = np.random.default_rng(seed)
    system = Message("system", (f"You are a careful assistant. {text(rng, words)}",))
    history: list[Message] = [system]
    requests = []
    for t in range(turns):
        history.append(Message("user", (f"Question {t}: {text(rng, words)}",)))
        requests.append(Request(tuple(history)))
        history.append(Message("assistant", (f"Answer {t}: {text(rng, words // 2)}",)))
    return Workload("growing_chat", tuple(requests), multimodal=False)


def shared_system(seed: int, users: int = 5, system_words: int = 120, words: int = 30) -> Workload:
    rng = np.random.default_rng(seed)
    system = Message("system", (f"Answer from these notes only. {text(rng, system_words)}",))
    requests = [Request((system, Message("user", (f"{text(rng, words)}?",)))) for _ in range(users)]
    return Workload("shared_system", tuple(requests), multimodal=False)


def replaced_image(seed: int, words: int = 30) -> Workload:
    rng = np.random.default_rng(seed)
    pics = [photo(seed * 100 + i, 64, 64) for i in range(3)]
    other = photo(seed * 100 + 99, 64, 64)  # replaces pics[1]: same size, other pixels
    system = Message("system", (f"You review photos. {text(rng, words)}",))
    asks = [f"Photo {i}: {text(rng, words)}" for i in range(3)]
    replies = [f"Noted {i}: {text(rng, words // 2)}" for i in range(3)]

    def conversation(turns: int, second: Image) -> Request:
        history: list[Message] = [system]
        for i in range(turns):
            if i:
                history.append(Message("assistant", (replies[i - 1],)))
            history.append(Message("user", (second if i == 1 else pics[i], asks[i])))
        return Request(tuple(history))

    requests = [conversation(k, pics[1]) for k in (1, 2, 3)] + [conversation(3, other)]
    return Workload("replaced_image", tuple(requests), multimodal=True)


def swapped_images(seed: int, words: int = 30) -> Workload:
    rng = np.random.default_rng(seed)
    a, b = photo(seed * 100, 64, 64), photo(seed * 100 + 1, 96, 96)
    system = Message("system", (f"You compare pictures. {text(rng, words)}",))
    first = Message("user", (f"Context: {text(rng, words)}",))
    reply = Message("assistant", (f"Understood: {text(rng, words // 2)}",))
    ask = f"Which of the two is brighter? {text(rng, words // 2)}"

    def pair(x: Image, y: Image) -> tuple[Message, ...]:
        return (system, first, reply, Message("user", (x, y, ask)))

    later = (
        Message("assistant", (f"The first: {text(rng, words // 2)}",)),
        Message("user", (f"And the second? {text(rng, words // 2)}",)),
    )
    requests = [
        Request(pair(a, b)),
        Request(pair(b, a)),
        Request(pair(b, a) + later),
    ]
    return Workload("swapped_images", tuple(requests), multimodal=True)


def family_workloads(seed: int = 0) -> list[Workload]:
    """The four workloads of the families with non-trimmable layers, built from ``seed``."""
    return [
        growing_chat(seed + 11),
        shared_system(seed + 12),
        replaced_image(seed + 13),
        swapped_images(seed + 14),
    ]


def workloads(size: str = "tiny", seed: int = 0) -> list[Workload]:
    """The four workloads at ``size`` ("tiny" or "large"), built from ``seed``."""
    if size not in SIZES:
        raise ValueError(f"size {size!r} is not one of {', '.join(SIZES)}")
    shape = SIZES[size]
    return [
        agentic_loop(shape, seed + 1),
        multimodal_agent(shape, seed + 2),
        photo_extraction(shape, seed + 3),
        image_edit(shape, seed + 4),
    ]
