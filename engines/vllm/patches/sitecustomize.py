"""Negative control for engines/vllm/run.sh: vLLM whose prefix-cache keys ignore images.

Put this directory first on PYTHONPATH of a vLLM server (mode ``vl-patched``): every Python
process of that server, the engine core included, runs it at start. When vLLM's
``vllm.v1.core.kv_cache_utils`` is imported, its ``_gen_mm_extra_hash_keys`` (the
``("mm", identifier, offset)`` extra keys of a block's hash) is replaced by one that returns
none, so two prompts with the same text and different images hash to the same blocks and the
second reuses the first one's KV cache. The plugin must catch it (cached != uncached logits).
Nothing else is touched, and nothing is imported before vLLM imports that module itself.

``VLLM_PATCH_IGNORES=lora`` (the LoRA negative control of engines/vllm/test_vllm_lora.py)
replaces ``_gen_lora_extra_hash_keys`` instead: blocks are keyed without the request's
adapter, so an adapter's request reuses the base model's KV cache.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

TARGET = "vllm.v1.core.kv_cache_utils"


def _ignore_images(
    request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[list[Any], int]:
    return [], start_mm_idx


def _ignore_adapters(request: Any) -> list[Any]:
    return []


def _patch(module: ModuleType) -> None:
    if os.environ.get("VLLM_PATCH_IGNORES") == "lora":
        module._gen_lora_extra_hash_keys = _ignore_adapters  # type: ignore[attr-defined]
        print(
            f"[vllm_patches] {TARGET}._gen_lora_extra_hash_keys ignores adapters", file=sys.stderr
        )
        return
    module._gen_mm_extra_hash_keys = _ignore_images  # type: ignore[attr-defined]
    print(f"[vllm_patches] {TARGET}._gen_mm_extra_hash_keys ignores images", file=sys.stderr)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            _patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _PatchOnImport())
