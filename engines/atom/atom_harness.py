"""ATOM's block manager (ROCm/ATOM ``atom/model_engine/block_manager.py``) under the
block-manager harness, on CPU: written here, importing ATOM's own modules from the source
tree ``ATOM_SRC`` names (a checkout outside this repository; nothing of ATOM is copied).

ATOM's ``atom.config`` imports torch and transformers (and its package ``__init__`` a plugin
module); the block manager needs only ``Config``'s attributes. So ``atom`` and
``atom.distributed`` are entered as bare packages (``__path__`` only, their ``__init__``
skipped) and ``atom.config`` as a stand-in defining the two names the block manager imports.
Its scheduler imports torch (``atom.utils``) and exchanges ``ScheduledBatch`` objects with the
model runner, not nano-vllm's interface: the harness drives the block manager alone, in
nano-vllm's call order (reference_engine/harness/driver.py).

    ATOM_SRC=DIR PREFIXCACHE_BLOCK_MANAGER=atom_harness:block_manager \
    PREFIXCACHE_SEQUENCE=atom_harness:sequence  (engines/atom/run.sh sets these)
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass
from typing import Any

_SRC = os.environ.get("ATOM_SRC", "")
if not os.path.isfile(os.path.join(_SRC, "atom", "model_engine", "block_manager.py")):
    raise ImportError(f"ATOM_SRC={_SRC!r} has no atom/model_engine/block_manager.py")


def _package(name: str, path: str) -> None:
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules.setdefault(name, module)


_package("atom", os.path.join(_SRC, "atom"))
_package("atom.distributed", os.path.join(_SRC, "atom", "distributed"))
_package("atom.model_engine", os.path.join(_SRC, "atom", "model_engine"))


@dataclass
class DCPConfig:
    interleave_size: int = 1


class Config:  # only a name in annotations: the block manager reads attributes
    pass


_config = types.ModuleType("atom.config")
_config.Config = Config  # type: ignore[attr-defined]
_config.DCPConfig = DCPConfig  # type: ignore[attr-defined]
sys.modules.setdefault("atom.config", _config)

from atom.model_engine.block_manager import BlockManager  # noqa: E402
from atom.model_engine.sequence import Sequence  # noqa: E402
from atom.sampling_params import SamplingParams  # noqa: E402

_block_size = [16]


def block_manager(num_blocks: int, block_size: int) -> Any:
    """ATOM's BlockManager with prefix caching on, one GPU, no state pools, no events."""
    _block_size[0] = block_size
    config = types.SimpleNamespace(
        kv_cache_block_size=block_size,
        num_kvcache_blocks=num_blocks,
        enable_prefix_caching=True,
        decode_context_parallel_size=1,
        dcp_config=DCPConfig(),
        kv_events_config=None,
        max_num_batched_tokens=1 << 16,
    )
    return BlockManager(config)


def sequence(token_ids: list[int], sampling: Any, images: list[str] | None = None) -> Any:
    """ATOM's Sequence; a request with images carries ``multimodal_data`` as ATOM's
    multimodal path sets it (its contents are for the model runner, never hashed)."""
    params = SamplingParams(max_tokens=sampling.max_tokens, ignore_eos=True)
    data = {"images": list(images)} if images else None
    return Sequence(list(token_ids), _block_size[0], params, multimodal_data=data)
