"""The tiny model fixtures: the builder reproduces them, and mlx-vlm / mlx-lm load and run them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
mlx_lm = pytest.importorskip("mlx_lm")
mlx_vlm = pytest.importorskip("mlx_vlm")
pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from reference_engine import fixtures  # noqa: E402  (after the skips: it needs MLX)
from reference_engine.fixtures.draft import DRAFTS, draft_dir  # noqa: E402
from reference_engine.fixtures.tokenizer import SPECIAL_TOKENS, vocab_size  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
QWEN2_VL = FIXTURES / fixtures.QWEN2_VL_DIR
LLAMA = FIXTURES / fixtures.LLAMA_DIR
#: Every directory ``python -m reference_engine.fixtures`` writes (the drafts last).
ALL_DIRS = (
    fixtures.QWEN2_VL_DIR,
    fixtures.LLAMA_DIR,
    fixtures.QWEN3_5_VL_DIR,
    fixtures.QWEN3_5_DIR,
    fixtures.GEMMA3_DIR,
    fixtures.GEMMA3_TEXT_DIR,
    fixtures.GEMMA4_DIR,
    fixtures.GEMMA4_TEXT_DIR,
    *(draft_dir(name) for name in DRAFTS),
)
IMAGE_PAD = "<|image_pad|>"


@pytest.fixture(scope="module", autouse=True)
def cpu_device() -> Iterator[None]:
    """Run MLX on its CPU device, where results are reproducible bit for bit."""
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(previous)


@pytest.fixture(autouse=True)
def no_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep mlx-vlm's prefix cache (and its disk tier under ~/.cache) off."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("APC_ENABLED", raising=False)
    monkeypatch.setenv("APC_DISK_ENABLED", "0")


@pytest.fixture(scope="module")
def qwen2_vl() -> tuple[Any, Any]:
    model, processor = mlx_vlm.load(str(QWEN2_VL))
    return model, processor


@pytest.fixture(scope="module")
def llama() -> tuple[Any, Any]:
    model, tokenizer = mlx_lm.load(str(LLAMA))
    return model, tokenizer


def noise_image(width: int, height: int, seed: int = 0) -> Any:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def files_of(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def test_builder_reproduces_the_committed_fixtures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fixtures.main(["--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted((*ALL_DIRS, "adapters"))
    for name in ALL_DIRS:
        assert str(tmp_path / name) in printed
        committed, built = files_of(FIXTURES / name), files_of(tmp_path / name)
        assert sorted(built) == sorted(committed), f"{name}: the builder writes other files"
        differing = [file for file in committed if committed[file] != built[file]]
        assert not differing, (
            f"{name}: {differing} differ from a fresh build; "
            "regenerate with: python -m reference_engine.fixtures"
        )


def test_two_builds_are_byte_identical(tmp_path: Path) -> None:
    """The builder run twice (in one process: the trainers and generators carry no state over)
    writes the same bytes."""
    first, second = fixtures.build_all(tmp_path / "a"), fixtures.build_all(tmp_path / "b")
    first, second = first[: len(ALL_DIRS)], second[: len(ALL_DIRS)]  # the adapters follow
    assert [p.name for p in first] == [p.name for p in second] == list(ALL_DIRS)
    for a, b in zip(first, second):
        assert files_of(a) == files_of(b), f"{a.name}: two builds differ"


@pytest.mark.parametrize("directory", [QWEN2_VL, LLAMA], ids=lambda path: path.name)
def test_fixture_is_small(directory: Path) -> None:
    assert sum(len(data) for data in files_of(directory).values()) < 2_000_000


def test_configs_name_the_tokenizers_special_ids() -> None:
    tokenizer = json.loads((QWEN2_VL / "tokenizer.json").read_text())
    ids = {token["content"]: token["id"] for token in tokenizer["added_tokens"]}
    assert list(ids) == list(SPECIAL_TOKENS)
    assert sorted(ids.values()) == list(range(vocab_size() - len(SPECIAL_TOKENS), vocab_size()))
    config = json.loads((QWEN2_VL / "config.json").read_text())
    assert config["vocab_size"] == vocab_size()
    assert config["image_token_id"] == ids["<|image_pad|>"]
    assert config["video_token_id"] == ids["<|video_pad|>"]
    assert config["vision_start_token_id"] == ids["<|vision_start|>"]
    assert config["eos_token_id"] == ids["<|im_end|>"]
    assert config["tie_word_embeddings"] is False
    assert isinstance(config["vision_config"]["mlp_ratio"], int)  # a float breaks mlx-vlm
    llama_config = json.loads((LLAMA / "config.json").read_text())
    assert llama_config["eos_token_id"] == ids["<|im_end|>"]
    assert llama_config["tie_word_embeddings"] is False


def test_chat_template_renders_chatml_without_a_default_system_prompt(
    qwen2_vl: tuple[Any, Any],
) -> None:
    _, processor = qwen2_vl
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "And now?"},
    ]
    rendered = processor.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What?<|im_end|>\n"
        "<|im_start|>assistant\nA cat.<|im_end|>\n"
        "<|im_start|>user\nAnd now?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    plain = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False
    )
    assert plain == "<|im_start|>user\nHi<|im_end|>\n"


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [(32, 32, 4), (64, 64, 16), (48, 80, 15), (100, 100, 36), (128, 128, 64), (200, 100, 55)],
)
def test_image_placeholder_count(
    qwen2_vl: tuple[Any, Any], width: int, height: int, tokens: int
) -> None:
    _, processor = qwen2_vl
    prompt = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n"
    inputs = processor(text=[prompt], images=[noise_image(width, height)])
    image_pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert int((inputs["input_ids"] == image_pad).sum().item()) == tokens
    grid_t, grid_h, grid_w = inputs["image_grid_thw"][0].tolist()
    assert grid_t * grid_h * grid_w == 4 * tokens
    assert inputs["pixel_values"].shape[0] == 4 * tokens


def test_qwen2_vl_forward_and_greedy_generation(qwen2_vl: tuple[Any, Any]) -> None:
    from mlx_vlm import stream_generate
    from mlx_vlm.prompt_utils import apply_chat_template

    model, processor = qwen2_vl
    image = noise_image(64, 64)
    prompt = apply_chat_template(processor, model.config, "What is in the image?", num_images=1)
    assert isinstance(prompt, str)
    inputs = processor(text=[prompt], images=[image])
    image_pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert int((inputs["input_ids"] == image_pad).sum().item()) == 16

    logits = model(
        inputs["input_ids"],
        pixel_values=inputs["pixel_values"],
        mask=inputs["attention_mask"],
        image_grid_thw=inputs["image_grid_thw"],
    ).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], vocab_size())
    assert logits.dtype == mx.float32
    assert bool(mx.isfinite(logits).all())

    steps = stream_generate(model, processor, prompt, image=[image], max_tokens=8, temperature=0.0)
    # mlx-vlm repeats the last token in a final step that flushes the detokenizer
    generated = list({step.generation_tokens: step.token for step in steps}.values())
    assert generated[0] == int(mx.argmax(logits[0, -1]).item())
    assert len(generated) == 8 or generated[-1] == model.config.eos_token_id
    assert len(set(generated)) > 1, f"a random model should not repeat one token: {generated}"


def test_llama_loads_and_generates(llama: tuple[Any, Any]) -> None:
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = llama
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Describe the picture."}], add_generation_prompt=True
    )
    logits = model(mx.array([prompt]))
    assert logits.shape == (1, len(prompt), vocab_size())
    assert bool(mx.isfinite(logits).all())

    steps = list(
        stream_generate(model, tokenizer, prompt, max_tokens=8, sampler=make_sampler(temp=0.0))
    )
    generated = [step.token for step in steps]
    assert generated[0] == int(mx.argmax(logits[0, -1]).item())
    assert len(set(generated)) > 1, f"a random model should not repeat one token: {generated}"
