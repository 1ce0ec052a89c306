"""Fresh reference engines share the loaded weights, not the cache: ``default_engine()`` (the
factory the baseline audit calls for every fresh instance) wraps the process's one load of the
model (``reference_engine.model.shared_model``) in a new engine. A fresh engine after a cached
run reuses nothing and answers as cold; the audit still catches an uncached path that is not
cold (the negative control: the same audit with the engine's own state handed to the "fresh"
instance lets it through)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from pytest_prefixcache import Image, Message, Request  # noqa: E402
from pytest_prefixcache.errors import EngineError, VerificationFailure  # noqa: E402
from pytest_prefixcache.verify import Verifier, VerifyOptions  # noqa: E402
from pytest_prefixcache.verify.audit import Audit  # noqa: E402
from reference_engine import Engine, default_engine, default_model_path  # noqa: E402
from reference_engine.model import shared_model  # noqa: E402
from reference_engine.vision import Prepared, VisionCache  # noqa: E402


def _img(seed: int) -> Image:
    rng = np.random.default_rng(seed)
    return Image(rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8))


def _req(text: str, image: Image) -> Request:
    return Request((Message("user", (text, image)),), max_new_tokens=2)


def test_fresh_engines_share_the_load_and_not_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFIXCACHE_MODEL", raising=False)
    used, fresh = default_engine(), default_engine()
    assert fresh.model is used.model  # one load
    for part in ("pool", "kv", "vision", "inflight"):
        assert getattr(fresh, part) is not getattr(used, part), part
    request = _req("Describe this image.", _img(1))
    used.run(request)
    warm = used.run(request)
    assert warm.cached_tokens  # the used engine reuses its prefix...
    cold = used.run(request, use_cache=False)
    after = fresh.run(request)
    assert after.cached_tokens == 0  # ...the fresh one has nothing to reuse
    assert fresh.stats.hit_tokens == 0 and fresh.stats.vision_hits == 0
    assert after.logits is not None and cold.logits is not None
    assert np.array_equal(np.asarray(after.logits), np.asarray(cold.logits))
    assert after.tokens == cold.tokens


def test_the_shared_model_is_handed_out_without_mlx_vlm_call_state() -> None:
    """mlx-vlm's Qwen VL language models keep the last prompt's M-RoPE ids on the module;
    the engine passes position ids itself, and each hand-out starts without them."""
    loaded = shared_model(default_model_path())
    lm = loaded.model.language_model
    lm._rope_deltas = mx.array([7])
    lm._position_ids = mx.zeros((3, 1, 4))
    assert shared_model(default_model_path()) is loaded
    assert lm._rope_deltas is None and lm._position_ids is None


def test_a_rebuilt_model_loads_again_and_a_missing_one_is_named(tmp_path: Path) -> None:
    copy = tmp_path / "model"
    shutil.copytree(default_model_path(), copy)
    first = shared_model(copy)
    assert shared_model(copy) is first
    config = copy / "config.json"
    config.write_text(config.read_text().rstrip() + "\n\n")  # another fingerprint
    assert shared_model(copy) is not first
    with pytest.raises(EngineError, match=r"'.*nowhere' has no config\.json"):
        shared_model(tmp_path / "nowhere")


class _RowsBySize(VisionCache):
    """BUG: image rows keyed by image size, kept across reset() and read on both paths."""

    def __init__(self, model: Any, max_entries: int = 64) -> None:
        super().__init__(model, max_entries)
        self.by_size: dict[tuple[int, ...], Any] = {}

    def rows(self, image: Image, entry: Prepared, *, use_cache: bool = True) -> Any:
        size = image.pixels.shape
        if size not in self.by_size:
            self.by_size[size] = super().rows(image, entry, use_cache=use_cache)
        return self.by_size[size]


class _StaleRows(Engine):
    def __init__(self, model: Any, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.vision = _RowsBySize(model)


def test_fresh_engines_on_the_shared_model_still_catch_a_baseline_that_is_not_cold(
    tmp_path: Path,
) -> None:
    """Cached == uncached (both read the stale rows), so only a fresh instance can see it.
    Negative control: a "fresh" instance that keeps the engine's state lets it through."""
    streams = [[_req("Describe this image.", _img(1))], [_req("Describe this image.", _img(2))]]
    options = VerifyOptions(failures_dir=tmp_path)

    def verify(fresh: Any) -> Verifier:
        engine = _StaleRows(shared_model(default_model_path()))
        verifier = Verifier(engine, options=options, audit=Audit(lambda: fresh(engine)))
        for stream in streams:  # the first request of each stream is audited
            verifier.run(stream)  # type: ignore[arg-type]
        return verifier

    with pytest.raises(VerificationFailure) as info:
        verify(lambda engine: _StaleRows(shared_model(default_model_path())))
    assert info.value.check == "cold baseline"
    stale_rows = _RowsBySize(shared_model(default_model_path()))

    def keeps_state(engine: Engine) -> Engine:
        stale_rows.by_size = engine.vision.by_size  # type: ignore[attr-defined]
        kept = _StaleRows(engine.model)
        kept.vision = stale_rows
        return kept

    assert verify(keeps_state).report.coverage["cold baseline"] == {"applied": 2}
