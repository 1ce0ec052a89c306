"""The measured tolerance rules of engines whose own split prefill is not bit-exact on a
family (``adapters/tolerances.py``): where they apply, that the difference they allow is real
and within the rule, and the negative control: the smallest one-token cache bug on the same
fixture is far above it."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from pytest_prefixcache.adapters.tolerances import (  # noqa: E402
    model_type_of,
    split_atol,
    split_rule,
)
from pytest_prefixcache.package_data import fixture_model  # noqa: E402


def test_where_the_rules_apply() -> None:
    assert split_atol("mlx-vlm", model_type_of(fixture_model("tiny-qwen3.5-vl"))) == 5e-3
    assert split_atol("mlx-vlm", model_type_of(fixture_model("tiny-gemma3"))) == 2e-4
    assert split_atol("mlx-lm", model_type_of(fixture_model("tiny-gemma3-text"))) == 2e-4
    # exact where it holds: mlx-lm's qwen3_5, every full-attention fixture
    for library, name in (
        ("mlx-lm", "tiny-qwen3.5"),
        ("mlx-lm", "tiny-llama"),
        ("mlx-vlm", "tiny-qwen2-vl"),
    ):
        assert split_atol(library, model_type_of(fixture_model(name))) is None
        assert split_rule(library, model_type_of(fixture_model(name))) == ""
    assert "split_tolerance.py" in split_rule("mlx-vlm", "qwen3_5")


def logprobs(lm: object, ids: list[int], cuts: list[int]) -> np.ndarray:
    for attr in ("_position_ids", "_rope_deltas"):  # mlx-vlm keeps them per prompt
        setattr(lm, attr, None)
    cache = lm.make_cache()  # type: ignore[attr-defined]
    start, out = 0, None
    for end in [*cuts, len(ids)]:
        out = lm(mx.array([ids[start:end]]), cache=cache)  # type: ignore[operator]
        start = end
    logits = out.logits[0, -1].astype(mx.float32)  # type: ignore[union-attr]
    return np.array(logits - mx.logsumexp(logits))


def test_the_qwen3_5_rule_covers_a_real_difference_and_no_real_bug() -> None:
    from mlx_vlm import load

    lm = load(str(fixture_model("tiny-qwen3.5-vl")))[0].language_model
    atol = split_atol("mlx-vlm", "qwen3_5")
    assert atol is not None
    rng = np.random.default_rng(1)
    ids = rng.integers(10, 480, size=300).tolist()
    one = logprobs(lm, ids, [])
    split = logprobs(lm, ids, [100])
    assert 0 < np.max(np.abs(one - split)) < atol / 4  # not exact, well inside the rule
    assert np.array_equal(one, logprobs(lm, ids, [128]))  # exact at a multiple of 64
    stale = list(ids)
    stale[280] = stale[280] + 1  # one token 20 positions back: a stale cached row at least
    assert np.max(np.abs(one - logprobs(lm, stale, []))) > 100 * atol
