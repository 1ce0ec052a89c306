"""``tokens.PieceTokenizer``: piece-by-piece tokenisation equals whole-text tokenisation.

Hypothesis writes texts from words, whitespace, digits, non-ASCII letters and the tokenizer's
added tokens (ChatML markers, image pads, runs of pads), and asserts that the ids piece by
piece, with the pieces remembered from earlier texts, equal the tokenizer's on the whole
text. The engine's cached runs render with it and its uncached runs without; a rendered
conversation gets the same ids both ways. A tokenizer whose added tokens strip whitespace
gets no piece tokenizer (the cut would not be exact); the negative control shows why.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("mlx.core")

from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import SYSTEM, assistant, img, req, user

from reference_engine import Engine
from reference_engine.tokens import PieceTokenizer

WORDS = st.sampled_from(
    ["the", " cat", "Describe", "image", " ", "  ", "\n", "\n\n", "\t", "42", "é", "naïve", "日本"]
)


@pytest.fixture(scope="module")
def pieces(model: Any) -> PieceTokenizer:
    found = PieceTokenizer.for_tokenizer(model.tokenizer, max_chars=400)
    assert found is not None
    return found


@settings(max_examples=200, deadline=None, database=None)
@given(data=st.data())
def test_pieces_give_the_ids_of_the_whole_text(model: Any, pieces: PieceTokenizer, data) -> None:
    added = sorted(model.tokenizer.added_tokens_decoder.values(), key=lambda t: t.content)
    token = st.sampled_from([t.content for t in added])
    text = "".join(data.draw(st.lists(st.one_of(WORDS, token), max_size=30)))
    whole = tuple(int(t) for t in model.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert pieces.encode(text) == whole
    assert pieces.encode(text) == whole  # again, from remembered pieces


def test_cached_and_uncached_renders_agree_and_pieces_are_remembered(model: Any) -> None:
    engine = Engine(model)
    history = [SYSTEM, user("What is in this picture?", img(1)), assistant("A cat.")]
    first = req(*history, user("And this?", img(2)))
    second = req(*history, user("And this?", img(2)), assistant("A dog."), user("Sure?"))
    for request in (first, second):
        prepared = {i.digest: engine.vision.prepare(i, use_cache=False) for i in request.images}
        cached = engine.render(request, prepared, use_cache=True)
        uncached = engine.render(request, prepared, use_cache=False)
        assert cached == uncached
    assert engine.tokens is not None and engine.tokens.hits > 0


def test_a_tokenizer_whose_added_tokens_strip_whitespace_gets_none(model: Any) -> None:
    class Stripping:
        def __init__(self, token: Any) -> None:
            self.content, self.lstrip, self.rstrip = token.content, True, False
            self.single_word = self.normalized = False

    class Tokenizer:
        def __init__(self) -> None:
            decoder = model.tokenizer.added_tokens_decoder
            self.added_tokens_decoder = {i: Stripping(t) for i, t in decoder.items()}

        def __call__(self, text: str, **kwargs: Any) -> Any:
            return model.tokenizer(text, **kwargs)

    assert PieceTokenizer.for_tokenizer(Tokenizer()) is None
    assert PieceTokenizer.for_tokenizer(object()) is None  # no added tokens at all


def test_a_tokenizer_that_adds_a_prefix_space_to_a_first_word_gets_none(model: Any) -> None:
    """As sentencepiece tokenizers do: a piece starting with a word would get a space the
    whole text has not got there."""

    class PrefixSpace:
        added_tokens_decoder = model.tokenizer.added_tokens_decoder

        def __call__(self, text: str, **kwargs: Any) -> Any:
            return model.tokenizer(" " + text if text[:1].isalnum() else text, **kwargs)

    assert PieceTokenizer.for_tokenizer(PrefixSpace()) is None
    added = {t.content: i for i, t in model.tokenizer.added_tokens_decoder.items()}
    assert PieceTokenizer(PrefixSpace(), added).agrees("x\n y")  # no word after a cut: agrees


def test_negative_control_a_cut_that_is_not_exact_is_refused(model: Any) -> None:
    """Cutting also at a plain word (which BPE merges with its neighbours) changes the ids:
    ``agrees`` sees it, so such a tokenizer would get None."""
    added = {t.content: i for i, t in model.tokenizer.added_tokens_decoder.items()}
    wrong = PieceTokenizer(model.tokenizer, {**added, "at": -1})
    text = "the cat sat"
    assert not wrong.agrees(text)
    assert PieceTokenizer(model.tokenizer, added).agrees(text)


def test_the_memory_is_bounded_by_characters(model: Any) -> None:
    pieces = PieceTokenizer(model.tokenizer, {"<|im_end|>": 1}, max_chars=24)
    for i in range(10):
        pieces.encode(f"piece {i}<|im_end|>")  # 7 characters a piece
    kept = [("", "piece 7"), ("", "piece 8"), ("", "piece 9")]  # (namespace, piece)
    assert list(pieces._pieces) == kept
    long = "x" * 25  # too long to keep: tokenised each time, not kept
    whole = tuple(int(t) for t in model.tokenizer(long, add_special_tokens=False)["input_ids"])
    misses = pieces.misses
    assert pieces.encode(long) == whole and pieces.encode(long) == whole
    assert pieces.misses == misses + 2
    assert list(pieces._pieces) == kept and pieces._chars == 21
    with pytest.raises(ValueError, match="max_chars must be positive, got 0"):
        PieceTokenizer(model.tokenizer, {}, max_chars=0)
