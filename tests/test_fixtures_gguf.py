"""reference_engine/fixtures/gguf_models.py: the fixtures under HF names, and the two changes it
makes to llama.cpp's converter, checked against a stand-in converter (the real one needs torch
and runs in engines/llama/run.sh)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

st = pytest.importorskip("safetensors.numpy")

from reference_engine.fixtures import gguf_models  # noqa: E402  (after the skip)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
QWEN2_VL = FIXTURES / "tiny-qwen2-vl"
LLAMA = FIXTURES / "tiny-llama"


def test_every_qwen2_vl_weight_gets_a_distinct_hf_checkpoint_name() -> None:
    names = list(st.load_file(str(QWEN2_VL / "model.safetensors")))
    renamed = {gguf_models.hf_name(n) for n in names}
    assert len(renamed) == len(names)
    assert {n.split(".")[0] for n in renamed} == {"model", "lm_head", "visual"}
    assert "model.layers.1.self_attn.q_proj.bias" in renamed
    assert "visual.merger.mlp.2.weight" in renamed and "lm_head.weight" in renamed


def test_llama_names_are_kept_and_an_unknown_name_is_refused() -> None:
    names = list(st.load_file(str(LLAMA / "model.safetensors")))
    assert [gguf_models.hf_name(n) for n in names] == names
    with pytest.raises(ValueError, match=r"'encoder\.conv\.weight'"):
        gguf_models.hf_name("encoder.conv.weight")


def test_hf_copy_moves_the_patch_embedding_to_torch_layout_and_is_reproducible(
    tmp_path: Path,
) -> None:
    first = gguf_models.write_hf_named(QWEN2_VL, tmp_path / "a")
    second = gguf_models.write_hf_named(QWEN2_VL, tmp_path / "b")
    data = (first / "model.safetensors").read_bytes()
    assert data == (second / "model.safetensors").read_bytes()
    source = st.load_file(str(QWEN2_VL / "model.safetensors"))
    copy = st.load_file(str(first / "model.safetensors"))
    mlx_conv = source["vision_tower.patch_embed.proj.weight"]  # (out, t, h, w, in)
    torch_conv = copy["visual.patch_embed.proj.weight"]  # (out, in, t, h, w)
    assert mlx_conv.shape == (32, 2, 8, 8, 3) and torch_conv.shape == (32, 3, 2, 8, 8)
    assert torch_conv[5, 2, 1, 3, 7] == mlx_conv[5, 1, 3, 7, 2]
    np.testing.assert_array_equal(torch_conv, mlx_conv.transpose(0, 4, 1, 2, 3))
    for name, value in source.items():
        if "patch_embed" not in name:
            np.testing.assert_array_equal(copy[gguf_models.hf_name(name)], value, err_msg=name)
    for name in ("config.json", "tokenizer.json", "preprocessor_config.json"):
        assert (first / name).read_bytes() == (QWEN2_VL / name).read_bytes(), name


STAND_IN = {
    "conversion/__init__.py": "",
    "conversion/base.py": """
        class TextModel:
            def get_vocab_base_pre(self, tokenizer):
                raise NotImplementedError("BPE pre-tokenizer was not recognized")
    """,
    "conversion/qwenvl.py": """
        class Qwen2VLVisionModel:
            def modify_tensors(self, data, name, bid):
                if name.startswith("visual.merger.mlp."):
                    raise KeyError(f"Can not map tensor {name!r}")
                yield "v." + name, data
    """,
    "convert_hf_to_gguf.py": """
        import json, sys
        from pathlib import Path
        from conversion import base, qwenvl
        args = sys.argv[1:]
        out = Path(args[args.index("--outfile") + 1])
        names = [n for n, _ in qwenvl.Qwen2VLVisionModel().modify_tensors(
            None, "visual.merger.mlp.2.weight", None)]
        names += [n for n, _ in qwenvl.Qwen2VLVisionModel().modify_tensors(
            None, "visual.blocks.0.norm1.bias", 0)]
        pre = base.TextModel().get_vocab_base_pre(None)
        config = json.loads((Path(args[0]) / "config.json").read_text())
        out.write_text(json.dumps({"pre": pre, "names": names, "mmproj": "--mmproj" in args,
                                   "arch": config["architectures"], "argv": args}))
    """,
}


def test_build_runs_the_converter_with_gpt2_pre_tokenizer_and_merger_names(
    tmp_path: Path,
) -> None:
    converter = tmp_path / "converter"
    for name, text in STAND_IN.items():
        (converter / name).parent.mkdir(parents=True, exist_ok=True)
        (converter / name).write_text(textwrap.dedent(text))
    out = tmp_path / "out"
    paths = gguf_models.build_ggufs(out, converter, FIXTURES, python=sys.executable)
    assert [p.name for p in paths] == list(gguf_models.GGUF_FILES.values())
    assert sorted(p.name for p in out.iterdir()) == sorted(gguf_models.GGUF_FILES.values())
    got = {p.name: json.loads(p.read_text()) for p in paths}
    for name, result in got.items():
        assert result["pre"] == "gpt-2", name
        assert result["names"] == ["mm.2.weight", "v.visual.blocks.0.norm1.bias"], name
        assert result["argv"][1:3] == ["--outtype", "f32"], name
    assert got["tiny-llama.gguf"]["arch"] == ["LlamaForCausalLM"]
    assert got["tiny-qwen2-vl-mmproj.gguf"]["mmproj"] is True
    assert got["tiny-qwen2-vl.gguf"]["mmproj"] is False


def test_a_failing_converter_is_reported_with_its_output(tmp_path: Path) -> None:
    converter = tmp_path / "converter"
    for name, text in STAND_IN.items():
        (converter / name).parent.mkdir(parents=True, exist_ok=True)
        (converter / name).write_text(textwrap.dedent(text))
    (converter / "conversion" / "base.py").write_text("raise ImportError('torch is missing')\n")
    with pytest.raises(RuntimeError, match=r"converting text \(tiny-llama.gguf\)(.|\n)*torch"):
        gguf_models.build_ggufs(tmp_path / "out", converter, FIXTURES, python=sys.executable)
    assert not (tmp_path / "out" / "hf-staging").exists()
