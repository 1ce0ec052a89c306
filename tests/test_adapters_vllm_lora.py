"""adapters.vllm without vLLM: the LoRA adapters a vLLM server serves (``--lora-modules``
among the flags) are declared, so the generated streams send requests under them (the
adapter move); a server without them declares none. Against the vLLM stub
(tests/stub_openai.py), which ignores the LoRA flags."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from stub_openai import PAD

from pytest_prefixcache.adapters.flags import split_flags
from pytest_prefixcache.adapters.vllm import lora_names, vllm_server
from pytest_prefixcache.strategies._engine import stream_kwargs

STUB = Path(__file__).resolve().parent / "stub_openai.py"
PYTHON = f"{sys.executable} {STUB} --flavour vllm"


def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 264, "image_token_id": PAD}))
    return tmp_path


def test_lora_modules_name_the_adapters() -> None:
    words = split_flags(["--enable-lora --lora-modules a=/x b=/y --max-loras 2"])
    assert lora_names(words) == ("a", "b")
    assert lora_names(["--lora-modules=a=/x", "c=/z"]) == ("a", "c")
    spec = json.dumps({"name": "j", "path": "/p", "base_model_name": "m"})
    assert lora_names(["--lora-modules", spec, "a=/x", "a=/again"]) == ("j", "a")
    assert lora_names(["--enable-lora", "--max-loras", "2"]) == ()  # served by none


def test_the_preset_declares_the_adapters_it_serves(tmp_path: Path) -> None:
    flags = ["--enable-lora --lora-modules tenant-b=/a other=/b --max-lora-rank 8"]
    with vllm_server(model_dir(tmp_path), python=PYTHON, flags=flags) as engine:
        assert engine.adapters == ("tenant-b", "other")
        kwargs = stream_kwargs(engine)
        assert kwargs["adapters"] == ("tenant-b", "other") and "adapter" in kwargs["moves"]
    with vllm_server(model_dir(tmp_path), python=PYTHON) as plain:  # the negative control
        assert plain.adapters == ()
        assert "adapter" not in stream_kwargs(plain)["moves"]
