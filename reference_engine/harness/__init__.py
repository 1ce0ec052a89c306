"""The block-manager harness: a paged engine's real block manager (and scheduler) under the
suite, with the reference model's forward reading and writing the blocks it assigns.

Point it at your block manager with ``--prefixcache-engine=reference_engine.harness:from_env``
and the variables below (docs/adapters.md, "Your block manager under the harness"):

========================================  =================================================
``PREFIXCACHE_BLOCK_MANAGER``             ``pkg.mod:BlockManager`` (required): a class or a
                                          callable ``(num_blocks, block_size)``
``PREFIXCACHE_SEQUENCE``                  ``pkg.mod:Sequence``; default: ``Sequence`` of the
                                          block manager's module
``PREFIXCACHE_SCHEDULER``                 ``pkg.mod:Scheduler`` (optional): driven in its
                                          call order, with your block manager in it;
                                          nano-vllm's ``(seqs, is_prefill)`` or ATOM's
                                          batch objects (batches.py)
``PREFIXCACHE_BLOCK_SIZE``                tokens per block (default 16)
``PREFIXCACHE_NUM_BLOCKS``                physical blocks (default 256)
``PREFIXCACHE_BATCHED_TOKENS``            the scheduler's token budget per step (default
                                          65536; smaller: chunked prefill, where the
                                          scheduler chunks)
``PREFIXCACHE_BLOCK_MANAGER_IMAGES``      ``1``: pass images through (token-only hashing
                                          then collides across images: see engine.py)
``PREFIXCACHE_MODEL``                     a full-attention fixture or directory (default
                                          tiny-qwen2-vl)
========================================  =================================================
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from pytest_prefixcache.errors import EngineError

from .driver import Sampling, drive
from .engine import BlockManagerEngine
from .paged import PagedKV

__all__ = ["BlockManagerEngine", "PagedKV", "Sampling", "drive", "from_env", "load_object"]


def load_object(spec: str, variable: str) -> Any:
    """The object ``MODULE:ATTR`` names; EngineError naming ``variable`` and what is wrong."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise EngineError(f"{variable}={spec!r} is not MODULE:ATTR (e.g. pkg.block_manager:Cls)")
    try:
        mod = importlib.import_module(module)
    except Exception as exc:
        raise EngineError(
            f"{variable}={spec!r}: importing {module!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise EngineError(f"{variable}={spec!r}: {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EngineError(f"{variable}={spec!r}: {attr!r} is not a class or a callable")
    return obj


def _int(variable: str, default: int) -> int:
    value = os.environ.get(variable, "").strip()
    if not value:
        return default
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n <= 0:
        raise EngineError(f"{variable}={value!r} is not a positive integer")
    return n


def _model() -> Any:
    from .. import env_model_path
    from ..model import shared_model

    return shared_model(env_model_path())  # weights are read-only: fresh engines share them


def from_env() -> BlockManagerEngine:
    """A :class:`BlockManagerEngine` configured by the ``PREFIXCACHE_*`` variables above
    (a zero-argument factory: the baseline audit builds fresh instances with it)."""
    spec = os.environ.get("PREFIXCACHE_BLOCK_MANAGER", "").strip()
    if not spec:
        raise EngineError(
            "PREFIXCACHE_BLOCK_MANAGER is not set: name your block manager as MODULE:ATTR "
            "(e.g. nanovllm.engine.block_manager:BlockManager)"
        )
    block_manager = load_object(spec, "PREFIXCACHE_BLOCK_MANAGER")
    seq_spec = os.environ.get("PREFIXCACHE_SEQUENCE", "").strip()
    if seq_spec:
        sequence = load_object(seq_spec, "PREFIXCACHE_SEQUENCE")
    else:
        home = importlib.import_module(spec.partition(":")[0])
        sequence = getattr(home, "Sequence", None)
        if not callable(sequence):
            raise EngineError(
                f"PREFIXCACHE_SEQUENCE is not set and {spec.partition(':')[0]!r} has no "
                f"Sequence: name your sequence class as MODULE:ATTR"
            )
    sched_spec = os.environ.get("PREFIXCACHE_SCHEDULER", "").strip()
    scheduler: Callable[..., Any] | None = (
        load_object(sched_spec, "PREFIXCACHE_SCHEDULER") if sched_spec else None
    )
    images = os.environ.get("PREFIXCACHE_BLOCK_MANAGER_IMAGES", "").strip()
    if images not in ("", "0", "1"):
        raise EngineError(f"PREFIXCACHE_BLOCK_MANAGER_IMAGES={images!r} is not 0 or 1")
    return BlockManagerEngine(
        _model(),
        block_manager=block_manager,
        sequence=sequence,
        scheduler=scheduler,
        num_blocks=_int("PREFIXCACHE_NUM_BLOCKS", 256),
        block_size=_int("PREFIXCACHE_BLOCK_SIZE", 16),
        images=images == "1",
        batched_tokens=_int("PREFIXCACHE_BATCHED_TOKENS", 1 << 16),
        name=spec,
    )
