"""The tiny HF-format models for vLLM's CPU backend (reference_engine.fixtures.hf_models).

The config checks need neither torch nor vLLM. Building the models needs torch and
transformers (the vLLM venv of engines/vllm/run.sh has them; CI does not, and skips those
tests naming what is missing).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from reference_engine.fixtures import hf_models
from reference_engine.fixtures.qwen2_vl import image_processor_config
from reference_engine.fixtures.tokenizer import SPECIAL_TOKENS, vocab_size

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
IDS = {t: vocab_size() - len(SPECIAL_TOKENS) + i for i, t in enumerate(SPECIAL_TOKENS)}


def _heads(config: dict[str, Any]) -> tuple[int, int]:
    return config["hidden_size"] // config["num_attention_heads"], config["head_dim"]


@pytest.mark.parametrize("make", [hf_models.hf_llama_config, hf_models.hf_qwen2_vl_config])
def test_text_heads_are_a_size_vllm_cpu_accepts(make: Any) -> None:
    config = make(IDS)
    assert _heads(config) == (hf_models.HEAD_DIM, hf_models.HEAD_DIM), config
    assert hf_models.HEAD_DIM % 32 == 0 and config["hidden_size"] == 64
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0


def test_qwen2_vl_rope_sections_and_vision_heads_fit_a_head_of_32() -> None:
    config = hf_models.hf_qwen2_vl_config(IDS)
    assert sum(config["rope_scaling"]["mrope_section"]) == hf_models.HEAD_DIM // 2
    vision = config["vision_config"]
    assert vision["embed_dim"] // vision["num_heads"] == hf_models.HEAD_DIM
    assert vision["hidden_size"] == config["hidden_size"]  # the merger's output


def test_the_hybrid_has_attention_heads_of_32_and_plain_rope() -> None:
    config = hf_models.hf_qwen3_5_config(IDS)
    assert config["head_dim"] == hf_models.HEAD_DIM and config["model_type"] == "qwen3_5_text"
    gdn = (config["linear_key_head_dim"], config["linear_value_head_dim"])
    assert gdn == (hf_models.GDN_HEAD_DIM,) * 2
    assert {"linear_attention", "full_attention"} == set(config["layer_types"])
    assert not [k for k in config["rope_parameters"] if k.startswith("mrope")]


def test_special_ids_and_image_rule_are_the_mlx_fixtures_own() -> None:
    """The plugin renders vLLM requests with the MLX fixture (vlm:fixtures/tiny-qwen2-vl):
    same special ids, same image processor, hence the same prompt and image-pad counts."""
    mlx = json.loads((FIXTURES / "tiny-qwen2-vl" / "config.json").read_text())
    hf = hf_models.hf_qwen2_vl_config(IDS)
    for key in ("image_token_id", "vision_start_token_id", "eos_token_id", "vocab_size"):
        assert hf[key] == mlx[key], key
    saved = json.loads((FIXTURES / "tiny-qwen2-vl" / "preprocessor_config.json").read_text())
    assert image_processor_config() == saved


def _venv_python() -> Path:
    """The interpreter of engines/vllm/run.sh's venv (torch, transformers, no MLX)."""
    python = Path(os.environ.get("VLLM_VENV_PYTHON", ROOT / ".engines/vllm/venv/bin/python"))
    if not python.is_file():  # a worktree shares the main checkout's .engines/
        common = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--path-format=absolute", "--git-common-dir"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        python = Path(common).parent / ".engines/vllm/venv/bin/python" if common else python
    if not python.is_file():
        pytest.skip(f"building the HF models needs torch: no vLLM venv at {python} "
                    "(engines/vllm/run.sh install, or set VLLM_VENV_PYTHON)")  # fmt: skip
    return python


def _build(python: Path, out: Path) -> list[Path]:
    script = ROOT / "engines" / "lab" / "build_hf_models.py"
    done = subprocess.run(
        [str(python), str(script), "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HOME": str(out)},
        check=False,
    )
    assert done.returncode == 0, f"{script} --out {out} failed:\n{done.stderr[-2000:]}"
    return [out / hf_models.HF_LLAMA_DIR, out / hf_models.HF_QWEN2_VL_DIR]


def test_the_build_is_deterministic_and_keeps_the_fixture_tokenizer(tmp_path: Path) -> None:
    python = _venv_python()
    first, second = _build(python, tmp_path / "a"), _build(python, tmp_path / "b")
    for a, b in zip(first, second):
        files = sorted(p.name for p in a.iterdir())
        assert "model.safetensors" in files and "config.json" in files, files
        assert files == sorted(p.name for p in b.iterdir())
        for name in files:
            assert (a / name).read_bytes() == (b / name).read_bytes(), f"{a.name}/{name}"
        tokenizer = (FIXTURES / "tiny-llama" / "tokenizer.json").read_bytes()
        assert (a / "tokenizer.json").read_bytes() == tokenizer, a.name
        config = json.loads((a / "config.json").read_text())
        text = config.get("text_config", config)
        assert text["num_attention_heads"] == 2 and text["hidden_size"] == 64, config
        assert config.get("dtype", config.get("torch_dtype")) == "float32", config
