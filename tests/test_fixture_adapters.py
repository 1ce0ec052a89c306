"""The tiny LoRA adapters: mlx-lm loads them, they change the logits (a zero B does not), the
PEFT copy holds the same weights, and the builder reproduces the shipped files byte for byte."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
mlx_lm = pytest.importorskip("mlx_lm")

from reference_engine.fixtures.adapters import (  # noqa: E402  (after the skips: it needs MLX)
    ADAPTER_MODELS,
    adapter_dir,
    build_adapter,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PROMPT = [5, 17, 42, 99, 7, 3, 11, 64]


def _logits(model_dir: Path, adapter: Path | None) -> np.ndarray:
    with mx.stream(mx.cpu):
        model, _ = mlx_lm.load(
            str(model_dir), adapter_path=None if adapter is None else str(adapter)
        )
        out = model(mx.array([PROMPT]))
        mx.eval(out)
        return np.array(out.astype(mx.float32))


def _zero_b_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("peft"))
    weights = mx.load(str(dst / "adapters.safetensors"))
    zeroed = {k: (mx.zeros_like(v) if k.endswith("lora_b") else v) for k, v in weights.items()}
    mx.save_safetensors(str(dst / "adapters.safetensors"), zeroed)
    return dst


def _peft_as_mlx(src: Path, dst: Path) -> Path:
    """The PEFT copy mapped back to mlx-lm's names and layout, with its alpha / r as scale."""
    dst.mkdir()
    peft_cfg = json.loads((src / "peft" / "adapter_config.json").read_text())
    cfg = json.loads((src / "adapter_config.json").read_text())
    cfg["lora_parameters"]["scale"] = peft_cfg["lora_alpha"] / peft_cfg["r"]
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    peft = mx.load(str(src / "peft" / "adapter_model.safetensors"))
    back = {}
    for name, value in peft.items():
        stem = name.removeprefix("base_model.model.").removesuffix(".weight")
        stem, leaf = stem.rsplit(".", 1)
        back[f"{stem}.{ {'lora_A': 'lora_a', 'lora_B': 'lora_b'}[leaf] }"] = value.T
    mx.save_safetensors(str(dst / "adapters.safetensors"), back)
    return dst


@pytest.mark.parametrize("model", sorted(ADAPTER_MODELS))
def test_the_adapter_loads_and_changes_the_logits(model: str, tmp_path: Path) -> None:
    base = _logits(FIXTURES / model, None)
    tuned = _logits(FIXTURES / model, adapter_dir(FIXTURES, model))
    assert np.abs(tuned - base).max() > 0.05, f"{model}'s adapter barely changes the logits"
    # Negative control: the same adapter with B zeroed (a fresh LoRA) changes nothing, so the
    # check above can fail.
    inert = _logits(FIXTURES / model, _zero_b_copy(adapter_dir(FIXTURES, model), tmp_path / "z"))
    np.testing.assert_array_equal(inert, base)


@pytest.mark.parametrize("model", sorted(ADAPTER_MODELS))
def test_the_peft_copy_holds_the_same_adapter(model: str, tmp_path: Path) -> None:
    src = adapter_dir(FIXTURES, model)
    tuned = _logits(FIXTURES / model, src)
    via_peft = _logits(FIXTURES / model, _peft_as_mlx(src, tmp_path / "p"))
    np.testing.assert_allclose(via_peft, tuned, rtol=0, atol=1e-5)


def test_the_builder_reproduces_the_shipped_adapters(tmp_path: Path) -> None:
    for model in ADAPTER_MODELS:
        (tmp_path / model).symlink_to(FIXTURES / model)
        built = build_adapter(tmp_path, model)
        shipped = adapter_dir(FIXTURES, model)
        names = sorted(p.relative_to(shipped) for p in shipped.rglob("*") if p.is_file())
        assert names == sorted(p.relative_to(built) for p in built.rglob("*") if p.is_file())
        for name in names:
            assert (built / name).read_bytes() == (shipped / name).read_bytes(), name


def test_an_unknown_fixture_has_no_adapter(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no adapter is defined for fixture 'tiny-qwen2-vl'"):
        build_adapter(tmp_path, "tiny-qwen2-vl")
