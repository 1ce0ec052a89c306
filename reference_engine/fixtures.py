"""Deterministic, offline builder of the tiny random-weight model fixtures.

``python -m reference_engine.fixtures [--out DIR]`` writes two model directories (by default into
the repository's ``fixtures/``):

``tiny-qwen2-vl/``
    A Qwen2-VL (mlx-vlm's own ``qwen2_vl`` model: text hidden 64, 2 layers, 4 heads, 2 KV heads,
    M-RoPE sections [2, 3, 3], untied embeddings; vision depth 2, embed_dim 32, 4 heads, patch 8,
    spatial merge 2, temporal patch 2) that ``mlx_vlm.load`` loads.
``tiny-llama/``
    A text-only Llama (hidden 64, 2 layers, untied) with the same tokenizer and chat template,
    which ``mlx_lm.load`` loads and ``python -m mlx_lm.server --model DIR`` serves.

Both use float32 weights drawn from a fixed-seed NumPy generator, the byte-level BPE of
:mod:`reference_engine.fixtures_tokenizer` and a ChatML template. Nothing is downloaded; every
file is byte-for-byte reproducible (JSON keys in a fixed order, safetensors written with sorted
keys and fixed metadata).

Image-token rule of ``tiny-qwen2-vl`` (mlx-vlm's port of Qwen2-VL's ``smart_resize``): with
``factor = PATCH_SIZE * MERGE_SIZE = 16``, an image of W x H pixels is resized to w x h, where w
and h are W and H rounded to the nearest multiple of 16 (Python's ``round``: ties go to the even
multiple); if w*h > MAX_PIXELS (128*128), they are instead W and H divided by
sqrt(W*H / MAX_PIXELS) and floored to multiples of 16 (but at least 16); if w*h < MIN_PIXELS
(32*32), W and H multiplied by sqrt(MIN_PIXELS / (W*H)) and ceiled to multiples of 16. The image
then expands to ``(w / 16) * (h / 16)`` ``<|image_pad|>`` tokens: at least 4, and at most 64
unless the aspect ratio is extreme (3000x16 -> 109, its short side held at 16). Measured:
16x16 -> 4, 32x32 -> 4, 64x64 -> 16, 48x80 -> 15, 100x100 -> 36, 128x128 -> 64,
200x100 -> 55 (resized to 176x80), 256x256 -> 64.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from reference_engine.fixtures_tokenizer import save_tokenizer, vocab_size, write_json

SEED = 20240601
PATCH_SIZE = 8
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
MIN_PIXELS = 32 * 32
MAX_PIXELS = 128 * 128
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]

QWEN2_VL_DIR = "tiny-qwen2-vl"
LLAMA_DIR = "tiny-llama"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "fixtures"


def _text_config(vocab: int) -> dict[str, Any]:
    return {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def qwen2_vl_config(ids: dict[str, int]) -> dict[str, Any]:
    """The ``config.json`` of ``tiny-qwen2-vl``, given the special token ids."""
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        **_text_config(vocab_size()),
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "use_sliding_window": False,
        "sliding_window": 32768,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "vision_token_id": ids["<|vision_pad|>"],
        "vision_config": {
            "model_type": "qwen2_vl",
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,
            "num_heads": 4,
            "mlp_ratio": 4,
            "in_channels": 3,
            "patch_size": PATCH_SIZE,
            "spatial_patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        },
    }


def llama_config(ids: dict[str, int]) -> dict[str, Any]:
    """The ``config.json`` of ``tiny-llama``, given the special token ids."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **_text_config(vocab_size()),
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }


def image_processor_config() -> dict[str, Any]:
    """``preprocessor_config.json`` of ``tiny-qwen2-vl`` (Qwen2-VL image processor settings)."""
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD,
        "rescale_factor": 1 / 255,
        "resample": 3,
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "merge_size": MERGE_SIZE,
    }


def video_processor_config() -> dict[str, Any]:
    """``video_preprocessor_config.json`` of ``tiny-qwen2-vl``."""
    config = image_processor_config()
    del config["image_processor_type"]
    return {"video_processor_type": "Qwen2VLVideoProcessor", **config}


def random_weights(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Draw float32 weights for every parameter, in sorted name order, from one seeded generator.

    Norm weights are ones and norm biases zeros; embeddings are N(0, 1); other biases are
    N(0, 0.02); every other weight is N(0, 1/fan_in) with fan_in the product of all but its first
    dimension (Linear and Conv3d alike), which keeps the logits of a random model spread out.
    """
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        is_norm = "norm" in name or ".ln_" in name
        if is_norm and name.endswith(".weight"):
            value = np.ones(shape)
        elif is_norm:
            value = np.zeros(shape)
        elif "embed_tokens" in name:
            value = rng.standard_normal(shape)
        elif name.endswith(".bias"):
            value = 0.02 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
        weights[name] = value.astype(np.float32)
    return weights


def save_weights(path: Path, model: Any, seed: int) -> None:
    """Fill every parameter of the MLX ``model`` with :func:`random_weights` and save them."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    flat = cast("list[tuple[str, Any]]", tree_flatten(model.parameters()))
    shapes = {name: tuple(value.shape) for name, value in flat}
    weights = random_weights(shapes, seed)
    arrays = {name: mx.array(weights[name]) for name in sorted(weights)}
    mx.save_safetensors(str(path), arrays, metadata={"format": "mlx"})


def _qwen2_vl_model(config: dict[str, Any]) -> Any:
    from mlx_vlm.models import qwen2_vl

    model_config = qwen2_vl.ModelConfig(
        text_config=qwen2_vl.TextConfig.from_dict(config),
        vision_config=qwen2_vl.VisionConfig.from_dict(config["vision_config"]),
        model_type=config["model_type"],
        image_token_id=config["image_token_id"],
        video_token_id=config["video_token_id"],
        vision_start_token_id=config["vision_start_token_id"],
        vocab_size=config["vocab_size"],
        eos_token_id=config["eos_token_id"],
    )
    return qwen2_vl.Model(model_config)


def _llama_model(config: dict[str, Any]) -> Any:
    from mlx_lm.models import llama

    return llama.Model(llama.ModelArgs.from_dict(config))


def build_qwen2_vl(out_dir: Path, **text_overrides: Any) -> Path:
    """Write ``tiny-qwen2-vl/`` into ``out_dir`` and return its path.

    ``text_overrides`` replace text-model settings (``hidden_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``) to build a larger
    random model for benchmarks; the vision merger output and the M-RoPE sections follow.
    """
    target = Path(out_dir) / QWEN2_VL_DIR
    target.mkdir(parents=True, exist_ok=True)
    ids = save_tokenizer(target)
    config = qwen2_vl_config(ids)
    if text_overrides:
        config.update(text_overrides)
        config["vision_config"]["hidden_size"] = config["hidden_size"]
        half_head = config["hidden_size"] // config["num_attention_heads"] // 2
        t = half_head // 4
        config["rope_scaling"]["mrope_section"] = [
            t,
            (half_head - t) // 2,
            half_head - t - (half_head - t) // 2,
        ]
    write_json(target / "config.json", config)
    write_json(target / "preprocessor_config.json", image_processor_config())
    write_json(target / "video_preprocessor_config.json", video_processor_config())
    write_json(
        target / "processor_config.json",
        {"processor_class": "Qwen2VLProcessor", "image_processor": image_processor_config()},
    )
    save_weights(target / "model.safetensors", _qwen2_vl_model(config), SEED)
    return target


def build_llama(out_dir: Path) -> Path:
    """Write ``tiny-llama/`` into ``out_dir`` and return its path."""
    target = Path(out_dir) / LLAMA_DIR
    target.mkdir(parents=True, exist_ok=True)
    ids = save_tokenizer(target)
    config = llama_config(ids)
    write_json(target / "config.json", config)
    save_weights(target / "model.safetensors", _llama_model(config), SEED + 1)
    return target


def build_all(out_dir: Path = DEFAULT_OUT) -> list[Path]:
    """Write both fixtures into ``out_dir``; return their paths."""
    return [build_qwen2_vl(out_dir), build_llama(out_dir)]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: build the fixtures and print where they went."""
    parser = argparse.ArgumentParser(
        prog="python -m reference_engine.fixtures", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"Directory to write the fixtures into (default: {DEFAULT_OUT})",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for path in build_all(args.out):
        size = sum(f.stat().st_size for f in path.iterdir())
        print(f"{path}  {size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
