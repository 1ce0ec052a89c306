"""Where the engine cuts a prefill on a model with non-trimmable layers (``snapshots.boundaries``).

Every cut is a forward call of its own, so the engine cuts where a snapshot can buy reuse: at
each turn's start (the snapshot-aware reference's message starts, where two conversations with
different roles diverge) and after each reply header (the end of a prompt with a generation
prompt: a growing chat resumes there), not at the header's newline nor where a user or system
turn's content starts (``benchmarks/hybrid_cuts.py`` measured what each kind costs and buys). The
engine's boundaries are a superset of the reference's, so it reuses at least all the reference
allows; the negative controls, the engine without its turn-start cuts or without its
reply-header cuts, fall short of it where roles diverge and where a chat grows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from reference_engine.snapshots import GRID, boundaries

TURN, NEWLINE, IMAGE = 1, 2, 9


def chat(*turns: Sequence[int]) -> list[int]:
    """Token ids of turns, each ``TURN role NEWLINE content...``."""
    return [t for turn in turns for t in (TURN, *turn)]


def test_turn_starts_and_content_starts_are_boundaries_the_header_newline_is_not() -> None:
    ids = chat([5, NEWLINE, 7, 7, 7], [6, NEWLINE, 8, IMAGE, IMAGE, 8], [5, NEWLINE])
    # turn starts 0, 6, 13; content starts 3, 9, 16 (the prompt's end); the image [10, 12)
    assert boundaries(ids, [(10, 12, "d")], TURN, NEWLINE) == [3, 6, 9, 10, 12, 13, 16]
    assert 2 not in boundaries(ids, [], TURN, NEWLINE)  # the header's newline: no cut
    # without a header end the turn starts alone; without a turn token, image edges and the grid
    assert boundaries(ids, [], TURN, None) == [6, 13]
    long = [7] * (2 * GRID + 5)
    assert boundaries(long, [(3, 4, "d")], None, NEWLINE) == [3, 4, GRID, 2 * GRID]


def test_with_a_reply_header_only_the_replies_content_starts_are_boundaries() -> None:
    reply = [TURN, 6, NEWLINE]
    ids = chat(
        [5, NEWLINE, 7, 7, 7], [6, NEWLINE, 8, IMAGE, IMAGE, 8], [5, NEWLINE, 7], [6, NEWLINE]
    )
    # turn starts 0, 6, 13, 17; the reply turns' content starts 9 and 20 (the prompt's end); the
    # user turns' content starts 3 and 16 are not boundaries, nor the header newlines
    assert boundaries(ids, [(10, 12, "d")], TURN, NEWLINE, reply_header=reply) == [
        6, 9, 10, 12, 13, 17, 20,
    ]  # fmt: skip
    # a header that only starts like the reply's is not one
    assert boundaries(chat([6, 6, NEWLINE, 7]), [], TURN, NEWLINE, reply_header=reply) == []


def test_a_header_longer_than_max_header_gets_its_turn_start_only() -> None:
    ids = chat([5] * 12 + [NEWLINE, 7])
    assert boundaries(ids, [], TURN, NEWLINE) == []  # position 0 is never a boundary
    ids = chat([5, NEWLINE, 7], [5] * 12 + [NEWLINE, 7])
    assert boundaries(ids, [], TURN, NEWLINE) == [3, 4]


# -- the engine on the hybrid fixture ------------------------------------------------------------
mx = pytest.importorskip("mlx.core")

from test_engine import SYSTEM, assistant, req, user  # noqa: E402

from pytest_prefixcache.checks.references import boundaries as reference_points  # noqa: E402
from pytest_prefixcache.checks.references import last_boundary  # noqa: E402
from pytest_prefixcache.package_data import fixture_model  # noqa: E402
from reference_engine import Engine, resume  # noqa: E402
from reference_engine.model import LoadedModel, load_model  # noqa: E402


@pytest.fixture(scope="module")
def hybrid() -> LoadedModel:
    return load_model(fixture_model("tiny-qwen3.5-vl"))


@pytest.fixture
def without_turn_starts(monkeypatch: pytest.MonkeyPatch, hybrid: LoadedModel) -> Iterator[None]:
    """The engine with the turn starts taken out of its cuts (the negative control)."""

    def fewer(ids: Sequence[int], spans: Any, turn: Any, end: Any = None, **kw: Any) -> list[int]:
        found = boundaries(ids, spans, turn, end, **kw)
        return [p for p in found if p == len(ids) or ids[p] != turn]

    monkeypatch.setattr(resume, "boundaries", fewer)
    yield


@pytest.fixture
def without_reply_cuts(monkeypatch: pytest.MonkeyPatch, hybrid: LoadedModel) -> Iterator[None]:
    """The engine with its turn starts only: no cut after the reply header (a negative control)."""
    monkeypatch.setattr(hybrid, "reply_header", None)
    monkeypatch.setattr(hybrid, "header_end_id", None)
    yield


def diverging_roles(model: LoadedModel) -> tuple[int, int, float]:
    """An engine serves a chat ending in an assistant turn, then the same chat with a user
    turn in its place: the prompts diverge just after that turn's start token. Returns the
    second request's reuse, the snapshot-aware reference for it (the first prompt's message
    starts, image edges and end) and the largest |cached - cold| over its steps."""
    engine = Engine(model)
    u1 = user("Describe the colours of a sunset over the sea, briefly.")
    first = req(SYSTEM, u1, assistant("Orange, pink and a deep violet."))
    second = req(SYSTEM, u1, user("Now the colours of a forest in the autumn."))
    a = engine.run(first, use_cache=True)
    warm = engine.run(second, use_cache=True)
    cold = engine.run(second, use_cache=False)
    ids_a, ids_b = a.token_ids or (), warm.token_ids or ()
    shared = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y)
    points = reference_points(len(ids_a), a.image_spans or (), a.message_starts)
    reference = last_boundary(points, min(shared, len(ids_b) - 1))
    assert warm.step_logits is not None and cold.step_logits is not None
    worst = max(float(np.max(np.abs(x - y))) for x, y in zip(warm.step_logits, cold.step_logits))
    return warm.cached_tokens or 0, reference, worst


@pytest.mark.slow
def test_the_engine_reuses_all_the_reference_allows_where_roles_diverge(
    hybrid: LoadedModel,
) -> None:
    reused, reference, worst = diverging_roles(hybrid)
    assert reference > 0 and reused == reference and worst == 0.0


@pytest.mark.slow
def test_without_turn_start_cuts_the_engine_falls_short_there(
    hybrid: LoadedModel, without_turn_starts: None
) -> None:
    reused, reference, worst = diverging_roles(hybrid)
    assert reused < reference and worst == 0.0  # still exact, but short of the reference


def growing_chat(model: LoadedModel) -> tuple[int, int, int, float]:
    """A chat grows by a reply and a user turn: the second request's reuse, the first prompt's
    length (its end: the reference's boundary), the reference and the largest |cached - cold|."""
    engine = Engine(model)
    u1 = user("Name three colours of a sunset over the sea.")
    first = req(SYSTEM, u1)
    second = req(SYSTEM, u1, assistant("Orange, pink and violet."), user("And of a forest?"))
    a = engine.run(first, use_cache=True)
    warm = engine.run(second, use_cache=True)
    cold = engine.run(second, use_cache=False)
    ids_a = a.token_ids or ()
    points = reference_points(len(ids_a), a.image_spans or (), a.message_starts)
    reference = last_boundary(points, len(ids_a))
    assert warm.step_logits is not None and cold.step_logits is not None
    worst = max(float(np.max(np.abs(x - y))) for x, y in zip(warm.step_logits, cold.step_logits))
    return warm.cached_tokens or 0, len(ids_a), reference, worst


def test_a_growing_chat_resumes_at_the_whole_previous_prompt(hybrid: LoadedModel) -> None:
    assert hybrid.reply_header is not None
    reused, length, reference, worst = growing_chat(hybrid)
    assert reused == length == reference and worst == 0.0


def test_without_reply_cuts_a_growing_chat_falls_short(
    hybrid: LoadedModel, without_reply_cuts: None
) -> None:
    reused, length, reference, worst = growing_chat(hybrid)
    assert 0 < reused < reference == length and worst == 0.0  # exact, but short of the reference
