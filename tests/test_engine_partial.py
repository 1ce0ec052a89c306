"""Token-granular reuse: the reference engine reuses exactly the oracle's maximum, mid-block.

Each scenario runs a history through the cache, then the final request cached and cold
(``compare`` from test_engine: bit-identical logits and decode steps), and asserts that the
cached tokens equal ``ReuseOracle``'s maximum, and that the reuse really ends where the
scenario says (inside a block, inside the stored partial tail, at an image's start). The
negative controls break the partial match (one row too many; the image clamp left out) and
assert that the comparison then fails.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("mlx.core")

from test_engine import BS, SYSTEM, assistant, compare, img, req, user

from pytest_prefixcache import Outcome, Request
from pytest_prefixcache.checks.oracle import ReuseOracle
from reference_engine import Engine
from reference_engine import pool as pool_mod
from reference_engine.blocks import BlockKey, agreeing_prefix

FOX = "The quick brown fox jumps over the lazy {} and then it rests under the old tree."
I1, I2 = img(31), img(32)

SCENARIOS: dict[str, tuple[list[Request], Request]] = {
    "divergence_mid_block": (
        [req(SYSTEM, user(FOX.format("dog")))],
        req(SYSTEM, user(FOX.format("cat"))),
    ),
    "partial_tail_extension": (
        [req(SYSTEM, user("A short question?"))],
        req(SYSTEM, user("A short question?"), assistant("A short answer."), user("Why?")),
    ),
    "different_image_starts_mid_block": (
        [req(SYSTEM, user("What is this?", I1, "Answer briefly."))],
        req(SYSTEM, user("What is this?", I2, "Answer briefly.")),
    ),
    "same_image_then_divergence": (
        [req(SYSTEM, user("Look:", I1, "Describe the colours of it."))],
        req(SYSTEM, user("Look:", I1, "Describe the shapes of it.")),
    ),
    "exact_repeat": (
        [req(SYSTEM, user("Once more:", I1))],
        req(SYSTEM, user("Once more:", I1)),
    ),
}


@pytest.fixture(scope="module")
def engine() -> Engine:
    from reference_engine import default_model_path

    return Engine.from_pretrained(default_model_path(), block_size=BS)


def oracle_max(engine: Engine, history: list[Request], final: Request) -> int:
    """The oracle's maximum for ``final`` after ``history`` (prompts rendered uncached)."""
    oracle = ReuseOracle()
    for i, r in enumerate(history):
        out = engine.run(r, use_cache=False)
        oracle.add(i, r.namespace, out.token_ids, out.image_spans or ())
    out = engine.run(final, use_cache=False)
    return oracle.match(final.namespace, out.token_ids, out.image_spans or ()).max_reuse


def run(engine: Engine, name: str) -> tuple[Outcome, int]:
    history, final = SCENARIOS[name]
    best = oracle_max(engine, history, final)
    warm = compare(engine, history, final)
    assert warm.cached_tokens == best, f"reused {warm.cached_tokens}, oracle maximum {best}"
    return warm, best


def test_divergence_mid_block_reuses_up_to_the_first_different_token(engine: Engine) -> None:
    warm, best = run(engine, "divergence_mid_block")
    assert best % BS != 0, "the scenario must diverge inside a block"
    assert warm.token_ids is not None
    cold_first = engine.run(SCENARIOS["divergence_mid_block"][0][0], use_cache=False)
    assert cold_first.token_ids[:best] == warm.token_ids[:best]
    assert cold_first.token_ids[best] != warm.token_ids[best]


def test_partial_tail_of_the_previous_prompt_is_reused(engine: Engine) -> None:
    history, _ = SCENARIOS["partial_tail_extension"]
    first = engine.run(history[0], use_cache=False)
    assert first.prompt_tokens is not None and first.prompt_tokens % BS != 0
    warm, best = run(engine, "partial_tail_extension")
    assert best == first.prompt_tokens == warm.cached_tokens


def test_different_image_starting_mid_block_clamps_to_its_start(engine: Engine) -> None:
    warm, best = run(engine, "different_image_starts_mid_block")
    assert warm.image_spans is not None
    start = warm.image_spans[0][0]
    assert start % BS != 0 and best == start
    assert warm.merges == ((warm.image_spans[0][1] - start,) * 2,)


def test_same_image_is_reused_and_the_cut_falls_in_the_text_after_it(engine: Engine) -> None:
    warm, best = run(engine, "same_image_then_divergence")
    assert warm.image_spans is not None and best % BS != 0
    assert best > warm.image_spans[0][1] and not warm.merges


def test_exact_repeat_computes_one_token(engine: Engine) -> None:
    warm, best = run(engine, "exact_repeat")
    assert warm.prompt_tokens is not None and best == warm.prompt_tokens - 1


def test_tails_are_superseded_by_the_blocks_that_extend_them(engine: Engine) -> None:
    """A growing conversation stores one partial tail per request; once a later request
    stores the full block that extends a tail, the tail is dropped: at most one tail per
    chain stays resident, and the byte count is the sum over the stored blocks."""
    engine.reset()
    messages = [SYSTEM]
    for turn in range(6):
        messages += [user(f"Turn {turn}: tell me more."), assistant(f"More, part {turn}.")]
        engine.run(req(*messages[:-1]), use_cache=True)
    blocks = engine.pool.blocks()
    tails = [b for b in blocks if len(b.key.tokens) < BS]
    assert len(tails) == 1
    assert engine.pool.stats.superseded > 0
    assert engine.pool.resident_bytes == sum(b.nbytes for b in blocks)
    assert all(b.refcount == 0 for b in blocks)


def _one_row_too_many(real: Callable[[BlockKey, BlockKey], int]) -> Callable[..., int]:
    def wrong(stored: BlockKey, wanted: BlockKey) -> int:
        n = real(stored, wanted)
        return min(n + 1, len(stored.tokens), len(wanted.tokens)) if n else 0

    return wrong


def _tokens_only(stored: BlockKey, wanted: BlockKey) -> int:
    n = 0
    while n < min(len(stored.tokens), len(wanted.tokens)) and stored.tokens[n] == wanted.tokens[n]:
        n += 1
    return n


@pytest.mark.parametrize("name", ["divergence_mid_block", "same_image_then_divergence"])
def test_negative_control_one_row_too_many_fails(engine, monkeypatch, name) -> None:
    monkeypatch.setattr(pool_mod, "agreeing_prefix", _one_row_too_many(agreeing_prefix))
    history, final = SCENARIOS[name]
    with pytest.raises(AssertionError, match="logits differ"):
        compare(engine, history, final)


def test_negative_control_partial_match_without_the_image_clamp_fails(engine, monkeypatch):
    monkeypatch.setattr(pool_mod, "agreeing_prefix", _tokens_only)
    history, final = SCENARIOS["different_image_starts_mid_block"]
    with pytest.raises(AssertionError, match="logits differ"):
        compare(engine, history, final)
