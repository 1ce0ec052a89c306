"""The verifier's uncached run prefills into a fresh cache, never a cacheless forward.

mlx-lm #1674: in mlx-lm's ``gemma3n`` a KV-shared layer reads its source layer's K/V only
``if self.is_kv_shared_layer and cache is not None`` (``Gemma3nAttention.__call__``); without a
cache it projects K/V of its own, so a cacheless forward is another model. A verifier whose cold
run were cacheless would compare a correct warm run with that other model and blame the cache.
Measured here on mlx-lm 0.32.2 and mlx-vlm 0.7.10 (tests below):

- ``gemma3n`` (a tiny random model built in memory): cacheless vs fresh cache differ by 0.13;
  a warm run (prefix, then suffix, on one cache) equals the fresh-cache cold run bit for bit;
- ``gemma4_text`` (tiny-gemma4-text) and mlx-vlm's ``gemma4`` (tiny-gemma4): cacheless equals
  fresh cache bit for bit (their ``Gemma4TextModel.__call__`` hands ``intermediates[prev_idx]``
  to the shared layers whether there is a cache or not), so Gemma 4 does not show the hazard in
  these versions; the reference engine's cold run uses a fresh cache anyway (asserted, with a
  negative control: the same assertion on a cacheless call fails).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
mlx_lm = pytest.importorskip("mlx_lm")
pytest.importorskip("mlx_vlm")

from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from test_engine import SYSTEM, img, req, user  # noqa: E402

from pytest_prefixcache.package_data import fixture_model  # noqa: E402
from reference_engine import Engine  # noqa: E402
from reference_engine.model import load_model  # noqa: E402

PROMPT = [int(t) for t in np.random.default_rng(0).integers(10, 400, 60)]


@functools.cache
def gemma3n() -> Any:
    """A tiny random mlx-lm ``gemma3n`` (4 layers, the last two KV-shared), in memory."""
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import gemma3n as module

    text = {
        "model_type": "gemma3n_text", "hidden_size": 64, "num_hidden_layers": 4,
        "intermediate_size": 128, "num_attention_heads": 4, "head_dim": 32, "rms_norm_eps": 1e-6,
        "vocab_size": 400, "num_key_value_heads": 2, "num_kv_shared_layers": 2,
        "vocab_size_per_layer_input": 400, "sliding_window": 32,
        "max_position_embeddings": 32768, "rope_local_base_freq": 10000.0, "rope_theta": 1e6,
        "final_logit_softcapping": 30.0, "layer_types": ["sliding_attention", "full_attention"] * 2,
        "activation_sparsity_pattern": [0.0] * 4, "hidden_size_per_layer_input": 16,
        "altup_num_inputs": 2, "altup_coef_clip": 120.0, "altup_correct_scale": True,
        "altup_active_idx": 0, "laurel_rank": 8,
    }  # fmt: skip
    model = module.Model(module.ModelArgs(model_type="gemma3n", text_config=text))
    rng = np.random.default_rng(1)
    params = [
        (k, mx.array((rng.standard_normal(v.shape) / np.sqrt(v.shape[-1])).astype(np.float32)))
        for k, v in tree_flatten(model.parameters())
    ]
    model.update(tree_unflatten(params))
    return model


def last(model: Any, ids: list[int], cache: Any) -> Any:
    return model(mx.array([ids]), cache=cache)[0, -1].astype(mx.float32)


def warm(model: Any, ids: list[int], split: int) -> Any:
    cache = make_prompt_cache(model)
    model(mx.array([ids[:split]]), cache=cache)
    return last(model, ids[split:], cache)


def gap(a: Any, b: Any) -> float:
    return float(mx.abs(a - b).max())


def test_gemma3n_cacheless_forward_is_another_model_and_would_blame_the_cache() -> None:
    model = gemma3n()
    fresh, cacheless = last(model, PROMPT, make_prompt_cache(model)), last(model, PROMPT, None)
    cached = warm(model, PROMPT, 40)
    assert gap(cached, fresh) == 0.0  # the cache is right: warm equals a fresh-cache cold run
    assert gap(cacheless, fresh) > 1e-2  # mlx-lm #1674: the shared layers project their own K/V
    assert gap(cached, cacheless) > 1e-2  # a cacheless reference would blame the warm side


def test_gemma4_cacheless_forward_shares_kv_in_these_versions() -> None:
    model, _ = mlx_lm.load(str(fixture_model("tiny-gemma4-text")))
    fresh, cacheless = last(model, PROMPT, make_prompt_cache(model)), last(model, PROMPT, None)
    assert gap(cacheless, fresh) == 0.0
    assert gap(warm(model, PROMPT, 40), fresh) == 0.0
    vlm = load_model(fixture_model("tiny-gemma4")).model.language_model
    out = [vlm(mx.array([PROMPT]), cache=c).logits[0, -1] for c in (vlm.make_cache(), None)]
    assert gap(out[0], out[1]) == 0.0 and gap(out[0], fresh) == 0.0


def fresh_cache_violations(calls: list[Any], layers: int) -> list[str]:
    """What is wrong with the caches a cold prefill handed the language model (``calls``: the
    ``cache`` argument of each call, with each entry's offset before the call)."""
    wrong = []
    for i, call in enumerate(calls):
        if call is None:
            wrong.append(f"call {i}: cache=None (a cacheless forward)")
        elif len(call) != layers:
            wrong.append(f"call {i}: {len(call)} cache entries, the model makes {layers}")
    if calls and calls[0] is not None and any(offset for _, offset in calls[0]):
        wrong.append(f"call 0: the cache was not fresh (offsets {[o for _, o in calls[0]]})")
    return wrong


def recording(lm: Any, calls: list[Any], *, drop_cache: bool = False) -> Any:
    def call(*args: Any, cache: Any = None, **kwargs: Any) -> Any:
        if drop_cache:
            cache = None
        calls.append(None if cache is None else [(c, int(c.offset)) for c in cache])
        return type(lm).__call__(lm, *args, cache=cache, **kwargs)

    return call


def test_the_engines_uncached_run_uses_a_fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(fixture_model("tiny-gemma4"))
    engine = Engine(model)
    request = req(SYSTEM, user("Describe this picture, please, in a few words.", img(1)))
    engine.run(request, use_cache=True)
    lm = model.model.language_model
    layers = len(lm.make_cache())
    calls: list[Any] = []
    monkeypatch.setattr(model.model, "language_model", _Proxy(lm, recording(lm, calls)))
    engine.run(request, use_cache=False)
    assert calls and fresh_cache_violations(calls, layers) == []
    # negative control: the same check on a cold run whose forward drops the cache
    dropped: list[Any] = []
    monkeypatch.setattr(
        model.model, "language_model", _Proxy(lm, recording(lm, dropped, drop_cache=True))
    )
    try:
        engine.run(request, use_cache=False)
    except Exception:  # a decode on a cache that never advanced may fail: the calls are in
        pass
    assert dropped and fresh_cache_violations(dropped, layers)[0].endswith("cacheless forward)")


class _Proxy:
    """The language model with its ``__call__`` replaced (attributes read through)."""

    def __init__(self, lm: Any, call: Any) -> None:
        self._lm, self._call = lm, call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lm, name)
