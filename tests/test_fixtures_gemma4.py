"""The Gemma 4 fixtures (tiny-gemma4, tiny-gemma4-text): mlx-vlm and mlx-lm load them, the
cache has one entry per non-shared layer, the two KV-shared layers have no K/V projections and
read their source layer's K/V, per-layer inputs and images matter, an image's token count
follows its shape, and the text fixture is the VLM's language model bit for bit.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
mlx_lm = pytest.importorskip("mlx_lm")
mlx_vlm = pytest.importorskip("mlx_vlm")

from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from reference_engine import fixtures  # noqa: E402
from reference_engine.fixtures.gemma4 import (  # noqa: E402
    KV_SHARED_LAYERS,
    MAX_SOFT_TOKENS,
    SLIDING_WINDOW,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GEMMA4 = FIXTURES / fixtures.GEMMA4_DIR
GEMMA4_TEXT = FIXTURES / fixtures.GEMMA4_TEXT_DIR
CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent. Think step by step and call one tool."},
    {"role": "user", "content": "The test suite fails on test_parse_dates; fix it. Please answer "
     "the question in one short sentence."},
]  # fmt: skip


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@functools.cache
def load_vlm() -> tuple[Any, Any]:
    return mlx_vlm.load(str(GEMMA4))


@functools.cache
def load_text() -> tuple[Any, Any]:
    return mlx_lm.load(str(GEMMA4_TEXT))


def chat_ids() -> list[int]:
    tok = load_text()[1]
    text = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    return list(tok.encode(text, add_special_tokens=False))


def text_logits(model: Any, ids: list[int]) -> Any:
    return model(mx.array([ids]), cache=make_prompt_cache(model))[0, -1].astype(mx.float32)


def noise_image(width: int, height: int, seed: int = 0) -> Any:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.mark.parametrize("path", [GEMMA4, GEMMA4_TEXT], ids=lambda p: p.name)
def test_vocabulary_is_the_tokenizers_size_and_the_directory_is_small(path: Path) -> None:
    from transformers import AutoTokenizer

    config = json.loads((path / "config.json").read_text())
    text = config.get("text_config", config)
    assert text["vocab_size"] == config["vocab_size"] == len(AutoTokenizer.from_pretrained(path))
    assert text["vocab_size_per_layer_input"] == text["vocab_size"]
    assert sum(f.stat().st_size for f in path.iterdir()) < 1_500_000


def test_every_gemma4_feature_is_present() -> None:
    model = load_text()[0]
    inner = model.model
    kinds = [layer.layer_type for layer in inner.layers]
    assert kinds == ["sliding_attention", "full_attention"] * 2
    # the last two layers read the K/V of the last non-shared layer of their type
    assert inner.previous_kvs == [0, 1, 0, 1]
    shared = [not layer.self_attn.has_kv for layer in inner.layers]
    assert shared == [False, False, True, True] and sum(shared) == KV_SHARED_LAYERS
    assert all(not hasattr(inner.layers[i].self_attn, "k_proj") for i in (2, 3))
    assert inner.hidden_size_per_layer_input == 16
    cache = make_prompt_cache(model)
    assert [type(c).__name__ for c in cache] == ["RotatingKVCache", "KVCache"]
    assert cache[0].max_size == SLIDING_WINDOW


def test_the_shared_layers_read_their_source_layers_kv() -> None:
    """Pointing the shared layers at other sources (layer 2 at layer 1's K/V, layer 3 at layer
    0's: same head size) changes the logits; restoring the map gives them back bit for bit."""
    model = load_text()[0]
    ids = chat_ids()
    base = text_logits(model, ids)
    inner = model.model
    try:
        inner.previous_kvs = [0, 1, 1, 0]
        moved = text_logits(model, ids)
    finally:
        inner.previous_kvs = [0, 1, 0, 1]
    assert float(mx.abs(moved - base).max()) > 1e-2
    assert float(mx.abs(text_logits(model, ids) - base).max()) == 0.0
    # the fresh cache holds exactly the two source layers' K/V: the shared layers add none
    cache = make_prompt_cache(model)
    model(mx.array([ids]), cache=cache)
    assert [c.offset for c in cache] == [len(ids)] * 2


def test_per_layer_inputs_matter() -> None:
    model = load_text()[0]
    ids = chat_ids()
    base = text_logits(model, ids)
    table = model.model.embed_tokens_per_layer
    saved = table.weight
    try:
        table.weight = mx.zeros_like(saved)
        assert float(mx.abs(text_logits(model, ids) - base).max()) > 1e-2
    finally:
        table.weight = saved


def test_logits_are_spread_and_greedy_generation_does_not_stick() -> None:
    model, tok = load_text()
    logits = np.array(text_logits(model, chat_ids()))
    assert logits.std() > 2.0
    prompt = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(mlx_lm.generate(model, tok, prompt, max_tokens=16), add_special_tokens=False)
    assert len(set(ids)) >= 6


def test_the_text_fixture_is_the_vlms_language_model() -> None:
    model, _ = load_vlm()
    ids = chat_ids()
    x = mx.array([ids])
    features = model.get_input_embeddings(input_ids=x)
    vlm = model.language_model(
        None, inputs_embeds=features.inputs_embeds, per_layer_inputs=features.per_layer_inputs,
        cache=model.language_model.make_cache(),
    ).logits[0, -1]  # fmt: skip
    assert float(mx.abs(vlm - text_logits(load_text()[0], ids)).max()) == 0.0


@pytest.mark.parametrize(
    ("width", "height", "tokens"), [(64, 64, 16), (160, 96, 15), (320, 32, 12), (512, 512, 16)]
)
def test_an_images_token_count_follows_its_shape(width: int, height: int, tokens: int) -> None:
    model, processor = load_vlm()
    prompt = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}],
        add_generation_prompt=True, tokenize=False,
    )  # fmt: skip
    assert prompt.count("<image_soft_token>") == 1
    inputs = processor(text=[prompt], images=[noise_image(width, height)], return_tensors="np")
    ids = list(np.asarray(inputs["input_ids"])[0])
    soft = ids.count(model.config.image_token_id)
    assert soft == tokens <= MAX_SOFT_TOKENS
    start = ids.index(model.config.boi_token_id)
    assert ids[start + 1 + soft] == model.config.eoi_token_id


def test_the_image_matters() -> None:
    model, processor = load_vlm()
    prompt = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}],
        add_generation_prompt=True, tokenize=False,
    )  # fmt: skip
    out = []
    for seed in (0, 1):
        inputs = processor(text=[prompt], images=[noise_image(64, 64, seed)], return_tensors="np")
        features = model.get_input_embeddings(
            input_ids=mx.array(inputs["input_ids"]), pixel_values=mx.array(inputs["pixel_values"])
        )
        out.append(model.language_model(
            None, inputs_embeds=features.inputs_embeds,
            per_layer_inputs=features.per_layer_inputs, cache=model.language_model.make_cache(),
        ).logits[0, -1])  # fmt: skip
    assert float(mx.abs(out[0] - out[1]).max()) > 1e-2
