"""What engines/vllm/run.sh relies on, checked without vLLM: the negative control's patch
(engines/vllm/patches/sitecustomize.py) takes effect when the module it patches is imported,
and the block-rounded oracle of engines/vllm/findings.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent

#: A stand-in for vllm.v1.core.kv_cache_utils: the function the patch replaces, and the caller
#: that looks it up as a module global, as vLLM 0.32.0's generate_block_hash_extra_keys does.
FAKE_KV_CACHE_UTILS = """
def _gen_mm_extra_hash_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    return [("mm", request, 0)], start_mm_idx + 1

def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    keys, nxt = _gen_mm_extra_hash_keys(request, start_token_idx, end_token_idx, start_mm_idx)
    return (tuple(keys) or None), nxt
"""


def _fake_vllm(root: Path) -> Path:
    core = root / "vllm" / "v1" / "core"
    core.mkdir(parents=True)
    for package in (root / "vllm", root / "vllm" / "v1", core):
        (package / "__init__.py").write_text("")
    (core / "kv_cache_utils.py").write_text(FAKE_KV_CACHE_UTILS)
    return root


def _block_keys(tmp_path: Path, *path: Path) -> str:
    code = (
        "from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys as g; "
        "print(g('image-digest', 0, 32, 0))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_patch_drops_image_keys_from_block_hashes_when_vllm_imports_them(
    tmp_path: Path,
) -> None:
    fake = _fake_vllm(tmp_path / "site")
    assert _block_keys(tmp_path, fake) == "((('mm', 'image-digest', 0),), 1)"  # unpatched
    patched = _block_keys(tmp_path, HERE / "patches", fake)
    assert patched == "(None, 0)", f"the patched block hash still keys on the image: {patched}"


def _findings(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_findings", HERE / "findings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_block_rounded_oracle_rounds_down_and_keeps_the_last_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    findings = _findings(monkeypatch)
    records = [
        {"prompt_tokens": 89, "cached_tokens": 64, "reusable": 88},  # 88 -> 64
        {"prompt_tokens": 64, "cached_tokens": 32, "reusable": 64},  # the last token: 63 -> 32
        {"prompt_tokens": 40, "cached_tokens": 0, "reusable": 31},  # no full block
        {"prompt_tokens": 50, "cached_tokens": 32, "reusable": None},  # no oracle figure
    ]
    assert findings.block_oracle({"records": records}) == (96, 96)
    records[0]["cached_tokens"] = 0
    assert findings.block_oracle({"records": records}) == (32, 96)
