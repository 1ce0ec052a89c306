"""ATOM's block manager (ROCm/ATOM ``atom/model_engine/block_manager.py``) under the
block-manager harness, on CPU: written here, importing ATOM's own modules from the source
tree ``ATOM_SRC`` names (a checkout outside this repository; nothing of ATOM is copied).

ATOM's ``atom.config`` imports torch and transformers (and its package ``__init__`` a plugin
module); the block manager needs only ``Config``'s attributes. So ``atom`` and
``atom.distributed`` are entered as bare packages (``__path__`` only, their ``__init__``
skipped) and ``atom.config`` as a stand-in defining the two names the block manager imports.
Its scheduler (``atom/model_engine/scheduler.py``) is driven as ATOM's engine core drives it
(reference_engine/harness/batches.py): ``schedule()`` -> its ``ScheduledBatch`` -> our model
runner -> its ``ScheduledBatchOutput`` -> ``postprocess(seqs, output, batch=batch)``. Its
imports that need torch or a GPU are entered as stand-ins for the names it reads:
``atom.utils.envs`` (one flag, off), ``atom.utils.forward_context.get_kvconnector`` (None: no
KV transfer configured, as ATOM returns), ``atom.kv_transfer.disaggregation.KVConnectorOutput``
(an annotation), ``atom.model_engine.prefill_delayer.PrefillDelayer`` (None: no data
parallelism).

    ATOM_SRC=DIR PREFIXCACHE_BLOCK_MANAGER=atom_harness:block_manager \
    PREFIXCACHE_SEQUENCE=atom_harness:sequence \
    PREFIXCACHE_SCHEDULER=atom_harness:scheduler  (engines/atom/run.sh sets these)
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


def _module(name: str, **names: Any) -> None:
    module = types.ModuleType(name)
    for key, value in names.items():
        setattr(module, key, value)
    sys.modules.setdefault(name, module)


class KVConnectorOutput:  # only a name in annotations
    pass


_package("atom.utils", os.path.join(_SRC, "atom", "utils"))
_package("atom.kv_transfer", os.path.join(_SRC, "atom", "kv_transfer"))
_module("atom.utils.envs", ATOM_ENABLE_DETAILED_ANNOTATION=False)
_module("atom.utils.forward_context", get_kvconnector=lambda role="worker", config=None: None)
_module("atom.kv_transfer.disaggregation", KVConnectorOutput=KVConnectorOutput)
_module("atom.model_engine.prefill_delayer", PrefillDelayer=None)
sys.modules["atom.utils"].envs = sys.modules["atom.utils.envs"]  # type: ignore[attr-defined]

_config = types.ModuleType("atom.config")
_config.Config = Config  # type: ignore[attr-defined]
_config.DCPConfig = DCPConfig  # type: ignore[attr-defined]
sys.modules.setdefault("atom.config", _config)

from atom.model_engine.block_manager import BlockManager  # noqa: E402
from atom.model_engine.sequence import Sequence  # noqa: E402
from atom.sampling_params import SamplingParams  # noqa: E402

_block_size = [16]


def _atom_config(num_blocks: int, block_size: int, **scheduling: Any) -> Any:
    """The attributes ATOM's BlockManager and Scheduler read: prefix caching and chunked
    prefill on (ATOM's defaults), one GPU, no speculation, no state pools, no events."""
    return types.SimpleNamespace(
        kv_cache_block_size=block_size,
        num_kvcache_blocks=num_blocks,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        decode_context_parallel_size=1,
        dcp_config=DCPConfig(),
        kv_events_config=None,
        speculative_config=None,
        long_prefill_token_threshold=0,
        scheduler_delay_factor=0.0,
        bos_token_id=-1,
        stop_token_ids=[],
        **scheduling,
    )


def block_manager(num_blocks: int, block_size: int) -> Any:
    """ATOM's BlockManager with prefix caching on, one GPU, no state pools, no events."""
    _block_size[0] = block_size
    return BlockManager(_atom_config(num_blocks, block_size, max_num_batched_tokens=1 << 16))


def scheduler(config: Any) -> Any:
    """ATOM's Scheduler on the harness's config (reference_engine/harness/driver.py:
    ``max_num_seqs``, ``max_num_batched_tokens``, ``eos``, ``kvcache_block_size``,
    ``num_kvcache_blocks``, ``max_model_len``)."""
    from atom.model_engine.scheduler import Scheduler

    return Scheduler(
        _atom_config(
            config.num_kvcache_blocks,
            config.kvcache_block_size,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            eos_token_id=config.eos,
        )
    )


def sequence(token_ids: list[int], sampling: Any, images: list[str] | None = None) -> Any:
    """ATOM's Sequence; a request with images carries ``multimodal_data`` as ATOM's
    multimodal path sets it (its contents are for the model runner, never hashed)."""
    params = SamplingParams(max_tokens=sampling.max_tokens, ignore_eos=True)
    data = {"images": list(images)} if images else None
    return Sequence(list(token_ids), _block_size[0], params, multimodal_data=data)
