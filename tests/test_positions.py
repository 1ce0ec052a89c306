"""``positions.mrope_positions`` against mlx-vlm's own ``get_rope_index``.

Hypothesis builds prompts from text runs (any length, zero included) and image placeholder
runs of random patch grids (adjacent images, an image first or last, several frames), and
asserts that the numpy position ids and rope delta equal the model's, element for element.
The negative control (text after an image continuing from the run's length instead of its
largest index) must differ.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("mlx.core")


import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_engine.positions import mrope_positions

TEXT = st.lists(st.integers(0, 300), max_size=12)
GRID = st.tuples(st.integers(1, 2), st.integers(1, 6), st.integers(1, 6)).map(
    lambda g: (g[0], 2 * g[1], 2 * g[2])  # h and w: multiples of the merge size (2)
)


def build(model: Any, pieces: list[Any]) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Token ids and grids of text runs and images, a vision-start token before each image."""
    ids: list[int] = []
    grids = []
    start = model.model.config.vision_start_token_id
    for piece in pieces:
        if isinstance(piece, tuple):
            ids.append(start)
            ids.extend([model.image_token_id] * model.placeholder_count(piece))
            grids.append(piece)
        else:
            ids.extend(piece)
    return ids, grids


def reference(model: Any, ids: list[int], grids: list[tuple[int, int, int]]) -> Any:
    pos, delta = model.rope_index(ids, grids)
    return np.asarray(pos)[:, 0, :], delta


@settings(max_examples=150, deadline=None, database=None)
@given(pieces=st.lists(st.one_of(TEXT, GRID), min_size=1, max_size=8))
def test_numpy_positions_equal_get_rope_index(model: Any, pieces: list[Any]) -> None:
    ids, grids = build(model, pieces)
    if not ids:
        return
    want, want_delta = reference(model, ids, grids)
    got, delta = model.positions(ids, grids)
    assert np.array_equal(np.asarray(got)[:, 0, :], want)
    assert delta == want_delta
    assert np.asarray(got).dtype == np.int32


def test_the_engine_uses_the_numpy_positions_for_qwen2_vl(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request with an image, cached and cold, gets its position ids from
    ``mrope_positions`` over its whole prompt; mlx-vlm's ``get_rope_index`` is never called
    (both give the same ids, so comparing values could not tell them apart)."""
    from test_engine import img, req, user

    from reference_engine import Engine
    from reference_engine import families as model_mod

    assert model.model_type == "qwen2_vl"
    prompts: list[tuple[int, ...]] = []

    def spy(token_ids: Any, grids: Any, **kwargs: Any) -> Any:
        prompts.append(tuple(token_ids))
        return mrope_positions(token_ids, grids, **kwargs)

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the engine called get_rope_index")

    monkeypatch.setattr(model_mod, "mrope_positions", spy)
    monkeypatch.setattr(type(model.model.language_model), "get_rope_index", forbidden)
    engine = Engine(model)
    request = req(user("What is this?", img(1)), max_new_tokens=2)
    outcomes = [engine.run(request, use_cache=True), engine.run(request, use_cache=False)]
    assert prompts == [o.token_ids for o in outcomes]


def test_control_image_positions_are_not_text_positions(model: Any) -> None:
    """Plain text positions (what the ``mrope_restart`` mutant feeds a suffix) differ from
    the ids of a prompt with an image, in the image and in the text after it."""
    ids, grids = build(model, [[5, 6], (1, 4, 6), [7, 8, 9]])
    want, delta = reference(model, ids, grids)
    plain = np.broadcast_to(np.arange(len(ids)), (3, len(ids)))
    assert not np.array_equal(plain[:, -3:], want[:, -3:]) and delta < 0


def test_more_grids_than_images_is_an_error(model: Any) -> None:
    ids, grids = build(model, [[5, 6], (1, 4, 4)])
    with pytest.raises(ValueError, match="2 image grids but no placeholder after position"):
        mrope_positions(ids, [*grids, (1, 4, 4)], image_token_id=model.image_token_id, merge_size=2)
