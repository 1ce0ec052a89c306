"""The quantized-KV tolerance rule of mlx_lm.server (``adapters/tolerances.py``,
``KV_QUANT_ATOL``): derived from the server command's ``--kv-bits``, covering the real
difference between mlx-lm's cold and warm quantized paths, and far from a one-token cache bug
(the negative control) on the same fixture."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pytest_prefixcache.adapters.tolerances import (
    KV_QUANT_ATOL,
    kv_bits_of,
    kv_quant_rule,
    with_measured_rules,
)
from pytest_prefixcache.package_data import fixture_model


class Stub:
    atol: float | None = None
    tolerance_rule = ""


def test_the_rule_derives_from_the_server_command() -> None:
    model = fixture_model("tiny-qwen3.5")
    base = f"python -m pytest_prefixcache.tap mlx_lm.server:main --model {model} --port 1"
    for flags, atol in (
        (" --kv-bits 8 --kv-group-size 32", 0.6),
        (" --kv-bits 4 --quantized-kv-start 48", 2.4),
        (" --kv-bits=4", 2.4),
        (" --kv-bits 8 --kv-bits 4", 2.4),  # argparse keeps the last
        ("", None),
        (" --kv-bits 3", None),  # not measured: judged exact
    ):
        engine = with_measured_rules(Stub(), base + flags)
        assert engine.atol == atol, flags
        assert ("kv_quant_tolerance.py" in engine.tolerance_rule) is (atol is not None)
    assert kv_bits_of("x --kv-bits four") is None and kv_bits_of("x") is None
    # the same flags on another family or library: no rule
    llama = base.replace(str(model), str(fixture_model("tiny-llama"))) + " --kv-bits 8"
    assert with_measured_rules(Stub(), llama).atol is None
    assert kv_quant_rule("mlx-vlm", "qwen3_5", 8) == (None, "")


def _logprobs(model: Any, requests: list[list[int]], bits: int) -> np.ndarray:
    """mlx_lm.server's sequential path: each request all but its last token, the cache
    quantized (start 0, group 32), then the last token, on one cache."""
    import mlx.core as mx
    from mlx_lm.generate import maybe_quantize_kv_cache

    cache = list(model.make_cache())
    out = None
    for ids in requests:
        model(mx.array([ids[:-1]]), cache=cache)
        maybe_quantize_kv_cache(cache, 0, 32, bits)
        out = model(mx.array([ids[-1:]]), cache=cache)
        maybe_quantize_kv_cache(cache, 0, 32, bits)
    assert out is not None
    logits = out[0, -1].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits))


@pytest.mark.parametrize("bits", [8, 4])
def test_the_rule_covers_the_real_difference_and_no_one_token_bug(bits: int) -> None:
    pytest.importorskip("mlx.core")
    from mlx_lm import load

    model = load(str(fixture_model("tiny-qwen3.5")))[0]
    atol = KV_QUANT_ATOL[("mlx-lm", "qwen3_5", bits)]
    rng = np.random.default_rng(bits)
    ids = rng.integers(10, 240, size=200).tolist()
    cold = _logprobs(model, [ids], bits)
    warm = _logprobs(model, [ids[:120], ids[120:]], bits)
    real = float(np.abs(cold - warm).max())
    assert 0.0 < real < atol  # a real difference: exact judging would call it a bug
    stale = list(ids)
    stale[-20] = 10 + (stale[-20] - 10 + 1) % 230
    bug = float(np.abs(cold - _logprobs(model, [stale], bits)).max())
    assert bug > 2 * atol, (bug, atol)  # negative control: the rule hides no one-token bug
