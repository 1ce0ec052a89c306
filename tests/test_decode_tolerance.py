"""The decode rule (``adapters/tolerances.py``, ``DECODE_ATOL``): where it applies, that the
difference it allows is real and within it (KV computed one decode step at a time vs a
prefill of the same positions), and the negative control at the measured margin: the
smallest real bug in decode-time KV (an output's rows one position off) is far above it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from pytest_prefixcache.adapters.tolerances import (  # noqa: E402
    decode_atol,
    decode_rule,
    model_type_of,
)
from pytest_prefixcache.package_data import fixture_model  # noqa: E402


def test_where_the_rule_applies() -> None:
    assert decode_atol("mlx-vlm", model_type_of(fixture_model("tiny-gemma3"))) == 2e-4
    assert decode_atol("mlx-lm", model_type_of(fixture_model("tiny-gemma3-text"))) == 2e-4
    assert decode_atol("mlx-vlm", model_type_of(fixture_model("tiny-qwen3.5-vl"))) == 1e-3
    for library, name in (  # measured bit-exact: no rule
        ("mlx-lm", "tiny-llama"),
        ("mlx-lm", "tiny-qwen3.5"),
        ("mlx-vlm", "tiny-qwen2-vl"),
    ):
        assert decode_atol(library, model_type_of(fixture_model(name))) is None
        assert decode_rule(library, model_type_of(fixture_model(name))) == ""
    assert "decode_tolerance.py" in decode_rule("mlx-lm", "gemma3_text")


def _last(lm: Any, chunks: list[list[int]]) -> np.ndarray:
    cache = lm.make_cache()
    out: Any = None
    for chunk in chunks:
        out = lm(mx.array([chunk]), cache=cache)
    logits = getattr(out, "logits", out)[0, -1].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits))


def test_the_gemma_rule_covers_decode_time_kv_and_no_off_by_one() -> None:
    from mlx_lm import load

    lm = load(str(fixture_model("tiny-gemma3-text")))[0]
    atol = decode_atol("mlx-lm", "gemma3_text")
    assert atol is not None
    rng = np.random.default_rng(3)
    worst, bug = 0.0, float("inf")
    for _ in range(4):
        prompt = rng.integers(10, 400, size=int(rng.integers(60, 300))).tolist()
        out = rng.integers(10, 400, size=5).tolist()  # the reply (its ids: any will do)
        nxt = prompt + out + rng.integers(10, 400, size=12).tolist()
        cold = _last(lm, [nxt])
        n = len(prompt)
        # decode-time KV for all output tokens but the last, then the rest of the next prompt
        warm = _last(lm, [prompt, *[[t] for t in out[:-1]], nxt[n + 4 :]])
        worst = max(worst, float(np.max(np.abs(cold - warm))))
        shifted = [prompt[-1], *out[:-2]]  # the output's rows one position off
        stale = _last(lm, [prompt, *[[t] for t in shifted], nxt[n + 4 :]])
        bug = min(bug, float(np.max(np.abs(cold - stale))))
    assert 0 < worst < atol / 4  # not exact, well inside the rule
    assert bug > 100 * atol
