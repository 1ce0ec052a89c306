"""The public strategies: validated when built, and streams that routinely contain every
situation a prefix cache gets wrong."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from pytest_prefixcache import Image, Message, Request
from pytest_prefixcache.strategies import (
    CLOSED_LOOP_SHARE,
    MOVES,
    conversations,
    image_pools,
    images,
    request_streams,
    request_waves,
    stream_kwargs,
    wave_kwargs,
)


def _is_prefix(a: Request, b: Request) -> bool:
    return len(a.messages) < len(b.messages) and b.messages[: len(a.messages)] == a.messages


def _user_has_image(m: Message) -> bool:
    return m.role == "user" and bool(m.images)


def stream_features(stream: tuple[Request, ...]) -> set[str]:
    """Which of the situations the issue lists this stream contains."""
    f: set[str] = set()
    objects: dict[str, set[int]] = {}
    for r in stream:
        for img in r.images:
            objects.setdefault(img.digest, set()).add(id(img))
        if len(r.images) != len(set(r.images)):
            f.add("same image twice in a request")
        if r.max_new_tokens > 0:
            f.add("max_new_tokens > 0")
        users = [m for m in r.messages if m.role == "user"]
        for ua, ub in itertools.pairwise(users):
            if not ua.images and ub.images:
                f.add("text-only turn before an image turn")
            if ua.images and not ub.images:
                f.add("text-only turn after an image turn")
    if any(len(ids) > 1 for ids in objects.values()):
        f.add("same pixels from another container")
    if len({r.namespace for r in stream}) >= 2:
        f.add("two namespaces")
    if len({img.size for r in stream for img in r.images}) >= 2:
        f.add("different image sizes")
    if len({r.messages[:2] for r in stream}) >= 3:
        f.add("three or more distinct prefixes")
    for a, b in itertools.combinations(stream, 2):
        if a == b:
            f.add("exact repeat")
        if a.namespace != b.namespace and a.messages == b.messages:
            f.add("same conversation in another namespace")
        if _is_prefix(a, b) and b.messages[len(a.messages)].role == "assistant":
            f.add("append-only growth with an assistant reply")
            if any(m.role == "assistant" for m in a.messages):
                f.add("growth over several turns")
        n = next((i for i, (x, y) in enumerate(zip(a.messages, b.messages)) if x != y), None)
        if n is not None and n > 0 and a.messages[n].role == b.messages[n].role == "user":
            f.add("edit of an earlier turn (branch)")
        ia, ib = a.images, b.images
        if ia != ib and sorted(i.digest for i in ia) == sorted(i.digest for i in ib) and ia:
            f.add("images swapped")
        if {i.digest for i in ia} & {i.digest for i in ib} and not (
            _is_prefix(a, b) or a.messages == b.messages
        ):
            f.add("same image across conversations")
        for x, y in zip(ia, ib):
            if x != y and x.size == y.size:
                f.add("distinct same-size images in the same slot")
    return f


EXPECTED = {
    "exact repeat",
    "append-only growth with an assistant reply",
    "growth over several turns",
    "edit of an earlier turn (branch)",
    "same image twice in a request",
    "same image across conversations",
    "distinct same-size images in the same slot",
    "images swapped",
    "different image sizes",
    "same pixels from another container",
    "text-only turn before an image turn",
    "text-only turn after an image turn",
    "two namespaces",
    "same conversation in another namespace",
    "max_new_tokens > 0",
    "three or more distinct prefixes",
}


@pytest.mark.slow
def test_default_streams_routinely_contain_every_situation() -> None:
    seen: Counter[str] = Counter()
    lengths: list[int] = []

    @seed(20261122)
    @settings(max_examples=100, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(request_streams())
    def collect(stream: tuple[Request, ...]) -> None:
        assert all(isinstance(r, Request) for r in stream)
        assert all(r.messages[-1].role == "user" for r in stream)
        lengths.append(len(stream))
        seen.update(stream_features(stream))

    collect()
    missing = EXPECTED - set(seen)
    assert not missing, f"never generated: {missing}"
    # "Routinely": every situation in at least 5% of the default budget's streams.
    rare = {k: v for k, v in seen.items() if k in EXPECTED and v < 5}
    assert not rare, f"rare: {rare}; all: {dict(seen)}"

    assert 2 <= min(lengths) and max(lengths) <= 8


@given(images())
@settings(max_examples=20, deadline=None)
def test_images_are_small_rgb(img: Image) -> None:
    w, h = img.size
    assert 16 <= w <= 96 and 16 <= h <= 96 and img.pixels.dtype.name == "uint8"


@given(image_pools(min_size=3, max_size=3))
@settings(max_examples=20, deadline=None)
def test_pools_hold_distinct_images(pool: tuple[Image, ...]) -> None:
    assert len(pool) == len(set(pool)) == 3


@given(conversations(min_turns=2, max_turns=3))
@settings(max_examples=20, deadline=None)
def test_conversations_alternate_and_end_with_a_user_turn(msgs: tuple[Message, ...]) -> None:
    roles = [m.role for m in msgs if m.role != "system"]
    assert roles[-1] == "user" and roles[::2] == ["user"] * len(roles[::2])
    assert 2 <= roles.count("user") <= 3


@given(request_streams(namespaces=("a", "b", "c"), max_new_tokens=0, moves=("new",)))
@settings(max_examples=10, deadline=None)
def test_stream_arguments_are_honoured(stream: tuple[Request, ...]) -> None:
    assert all(r.namespace in ("a", "b", "c") and r.max_new_tokens == 0 for r in stream)
    # moves=("new",): every request is a new conversation, none is derived from another
    assert all(len([m for m in r.messages if m.role == "user"]) == 1 for r in stream)


@pytest.mark.slow
def test_streams_shrink_to_a_minimal_collision_pair() -> None:
    def collides(stream: tuple[Request, ...]) -> bool:
        return any(
            x != y and x.size == y.size
            for a, b in itertools.combinations(stream, 2)
            for x, y in zip(a.images, b.images)
        )

    from hypothesis import find

    smallest = find(
        request_streams(),
        collides,
        settings=settings(database=None, max_examples=500, derandomize=True),
    )
    assert len(smallest) <= 3
    assert all(len(r.messages) <= 3 for r in smallest)


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: images(min_side=0), "min_side=0 is not an int from 1 to 1024"),
        (lambda: images(min_side=50, max_side=20), "min_side=50 is larger than max_side=20"),
        (lambda: images(patterns=("plaid",)), "patterns=('plaid',) must be a non-empty subset"),
        (lambda: image_pools(max_size=0), "max_size=0 is not an int from 1 to 64"),
        (lambda: conversations(min_turns=3, max_turns=2), "min_turns=3 is larger than max_turns=2"),
        (lambda: conversations(pool=[]), "pool=[] must be a non-empty sequence of Image"),
        (lambda: request_streams(min_requests=True), "min_requests=True is not an int"),
        (lambda: request_streams(namespaces=("a", "a")), "namespaces=('a', 'a') must be distinct"),
        (lambda: request_streams(max_new_tokens=-1), "max_new_tokens=-1 is not an int from 0"),
        (lambda: request_streams(moves=("jump",)), "moves=('jump',) must be a non-empty subset"),
    ],
)  # fmt: skip
def test_arguments_are_validated_when_built(build: object, says: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        build()  # type: ignore[operator]
    assert str(info.value).startswith(says)


def test_strategies_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        request_streams(2, 8)  # type: ignore[misc]


SHARED_POOL = (
    Image(np.zeros((16, 16, 3), "uint8")),
    Image(np.full((16, 16, 3), 200, "uint8")),
    Image(np.full((32, 16, 3), 90, "uint8")),
)


def test_a_strategy_pool_can_be_shared() -> None:
    """A pool given as a strategy is drawn once per stream, and every image of every request
    comes from it (same pixels; ``reencode`` makes another container of them)."""
    pool_digests = {img.digest for img in SHARED_POOL}
    seen: set[str] = set()

    @seed(20261122)
    @settings(max_examples=50, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(request_streams(pool=st.just(SHARED_POOL), max_images_per_message=1))
    def collect(stream: tuple[Request, ...]) -> None:
        digests = {img.digest for r in stream for img in r.images}
        assert digests <= pool_digests, f"images not from the pool: {digests - pool_digests}"
        seen.update(digests)

    collect()
    assert seen == pool_digests  # the streams really drew from the pool, all of it


@pytest.mark.parametrize("limit", [0, 1])
@pytest.mark.parametrize("move", MOVES)
def test_max_images_per_message_is_honoured_by_every_move(move: str, limit: int) -> None:
    """Streams made by one move (after the first, ``new``, request) never put more than
    ``max_images_per_message`` images in a message: with 0, no image at all (a text-only
    engine would fault on one)."""

    streams = request_streams(
        pool=st.just(SHARED_POOL), max_images_per_message=limit, moves=(move,), adapters=("a",)
    )

    @seed(20261123)
    @settings(max_examples=30, deadline=None, database=None)
    @given(streams)
    def check(stream: tuple[Request, ...]) -> None:
        counts = [len(m.images) for r in stream for m in r.messages]
        assert max(counts) <= limit, f"move {move!r} made a message with {max(counts)} images"

    check()


def test_the_engine_kwargs_keep_the_strategies_within_its_capabilities() -> None:
    """A text-only engine without namespaces gets no image or namespace moves, no images and
    one namespace; an engine that says nothing gets every move; waves take no stream knobs."""

    class TextOnly:
        supports_images = False
        supports_namespaces = False

    kw = stream_kwargs(TextOnly())
    assert not set(kw["moves"]) & {"replace", "swap", "reencode", "namespace"}
    assert (kw["max_images_per_message"], kw["namespaces"]) == (0, ("",))
    assert kw["closed_loop"] == CLOSED_LOOP_SHARE
    no_adapters = tuple(m for m in MOVES if m != "adapter")  # it declares none
    assert stream_kwargs(object()) == {"moves": no_adapters, "closed_loop": CLOSED_LOOP_SHARE}
    assert "closed_loop" not in wave_kwargs(TextOnly())
    request_waves(**wave_kwargs(TextOnly())).validate()
    request_streams(**kw).validate()
