"""The mlx-vlm APC adapter, block and exact-snapshot modes, with images; disk tier off."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("mlx_vlm")

from adapter_support import SYSTEM, assistant, img, req, resolve, user, worst_diff

from pytest_prefixcache.adapters.mlx_vlm_apc import MlxVlmApcEngine

A, B = img(1), img(2)  # two different 64x64 images: the same placeholder count
TEXT = req(SYSTEM, user("Hello there, how are you today? Tell me a long story about cats."))
TEXT_NEXT = req(*TEXT.messages, assistant("fine"), user("and now?"))
IMAGE = req(SYSTEM, user(A, "What is in this image?"))
IMAGE_NEXT = req(*IMAGE.messages, assistant("a cat"), user("and the colour?"))
FACTORIES = {
    "block": "pytest_prefixcache.adapters.mlx_vlm_apc:tiny_qwen2_vl",
    "snapshot": "pytest_prefixcache.adapters.mlx_vlm_apc:tiny_qwen2_vl_snapshot",
}


@pytest.fixture(scope="module", params=sorted(FACTORIES))
def module_engine(request: pytest.FixtureRequest) -> MlxVlmApcEngine:
    engine = resolve(FACTORIES[request.param])
    assert isinstance(engine, MlxVlmApcEngine) and engine.mode == request.param
    assert engine.manager.disk is None
    return engine


@pytest.fixture
def engine(module_engine: MlxVlmApcEngine) -> Iterator[MlxVlmApcEngine]:
    module_engine.reset()
    yield module_engine
    module_engine.reset()


def check(engine: MlxVlmApcEngine, request: Any) -> int:
    """Run cached then cold; assert bit-exact; return the cached run's reuse."""
    cached = engine.run(request, use_cache=True)
    cold = engine.run(request, use_cache=False)
    assert cold.cached_tokens == 0
    assert cached.token_ids == cold.token_ids and cached.image_spans == cold.image_spans
    assert worst_diff(cached, cold) == 0.0
    return cached.cached_tokens or 0


@pytest.mark.slow
def test_outcome_fields(engine: MlxVlmApcEngine) -> None:
    out = engine.run(req(SYSTEM, user(A, "and", B, "compare")), use_cache=True)
    assert out.logits is not None and out.logits.dtype.name == "float32"
    assert len(out.tokens) == 3 and len(out.step_logits) == 3
    assert out.prompt_tokens == len(out.token_ids or ())
    spans = out.image_spans or ()
    assert [s[2] for s in spans] == [A.digest, B.digest]
    assert all(end - start == 16 for start, end, _ in spans)  # patch 8: 64x64 -> 16 tokens


def test_text_stream_is_bit_exact_and_reuses_blocks(engine: MlxVlmApcEngine) -> None:
    assert check(engine, TEXT) == 0
    assert check(engine, TEXT) == 80  # 5 full blocks of the 89-token prompt
    assert check(engine, TEXT_NEXT) == 80


def test_cold_runs_do_not_store(engine: MlxVlmApcEngine) -> None:
    engine.run(TEXT, use_cache=False)
    assert engine.stats()["stores"] == 0 and engine.stats()["exact_stores"] == 0
    assert engine.run(TEXT, use_cache=True).cached_tokens == 0


@pytest.mark.parametrize(
    "history, final",
    [
        ([IMAGE], req(SYSTEM, user(B, "What is in this image?"))),  # same size, other pixels
        ([req(SYSTEM, user(A, "and", B, "compare"))], req(SYSTEM, user(B, "and", A, "compare"))),
        ([IMAGE, IMAGE_NEXT], IMAGE_NEXT),
        ([TEXT], req(*TEXT.messages, assistant("fine"), user(A, "and this?"))),
    ],
    ids=["other-image", "swapped-order", "image-next-turn", "text-then-image"],
)
def test_image_streams_are_bit_exact(
    engine: MlxVlmApcEngine, history: list[Any], final: Any
) -> None:
    for request in history:
        engine.run(request, use_cache=True)
    check(engine, final)


def test_snapshot_mode_reuses_a_prefix_holding_an_image(engine: MlxVlmApcEngine) -> None:
    if engine.mode != "snapshot":
        pytest.skip("snapshot mode only")
    check(engine, IMAGE)
    assert check(engine, IMAGE_NEXT) == 80


@pytest.mark.xfail(
    strict=True,
    reason="mlx-vlm 0.7.10 APC block mode discards a matched prefix that contains media "
    "tokens (apc_lookup_plan): an image request reuses 0 tokens, even an identical repeat",
)
def test_block_mode_reuses_an_identical_image_request(engine: MlxVlmApcEngine) -> None:
    if engine.mode != "block":
        pytest.skip("block mode only")
    check(engine, IMAGE)
    assert check(engine, IMAGE) > 0


@pytest.mark.xfail(
    strict=True,
    reason="mlx-vlm 0.7.10 APC: the block extra_hash is one salt over all of a request's "
    "pixel values, so a text history stops being reusable once an image is appended",
)
def test_text_history_is_reused_when_an_image_is_appended(engine: MlxVlmApcEngine) -> None:
    check(engine, TEXT)
    assert check(engine, req(*TEXT.messages, assistant("fine"), user(A, "and this?"))) > 0


def test_namespaces_are_isolated_with_a_positive_control(engine: MlxVlmApcEngine) -> None:
    engine.run(TEXT, use_cache=True)
    assert engine.run(req(*TEXT.messages, namespace="b"), use_cache=True).cached_tokens == 0
    assert (engine.run(TEXT, use_cache=True).cached_tokens or 0) > 0


def test_a_corrupted_cache_hit_is_caught(
    engine: MlxVlmApcEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: one cache APC restores is perturbed; the comparison must catch it."""
    from mlx_vlm.apc_coordinator import APCCoordinator

    original = APCCoordinator.materialize_single
    corrupted: list[bool] = []

    def materialize(self: Any, *args: Any, **kwargs: Any) -> Any:
        cache = original(self, *args, **kwargs)
        if not corrupted:
            for c in cache:
                c.keys = c.keys + 0.05
            corrupted.append(True)
        return cache

    monkeypatch.setattr(APCCoordinator, "materialize_single", materialize)
    engine.run(TEXT, use_cache=True)
    cached = engine.run(TEXT_NEXT, use_cache=True)
    cold = engine.run(TEXT_NEXT, use_cache=False)
    assert corrupted and (cached.cached_tokens or 0) > 0
    assert worst_diff(cached, cold) > 1e-4
