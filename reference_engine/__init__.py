"""The reference engine: an MLX engine with a segmented multimodal prefix cache done right.

Chained block hashes with image digests, reuse up to the first changed image, bit-exact
against a cold run. Importing this package imports MLX.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pytest_prefixcache.package_data import model_from_env, require_model, resolve_model

from .engine import DEFAULT_MAX_BYTES, Engine, EngineStats, default_model_path
from .fixtures.qwen2_vl import QWEN2_VL_DIR
from .model import shared_model

__all__ = [
    "DEFAULT_MAX_BYTES",
    "Engine",
    "EngineStats",
    "default_engine",
    "default_model_path",
    "env_model_path",
    "shared_model",
]


def env_model_path() -> Path:
    """The model ``PREFIXCACHE_MODEL`` names (a fixture name or a directory; set by
    ``--prefixcache-model``), else the tiny Qwen2-VL fixture."""
    return model_from_env(QWEN2_VL_DIR)


def default_engine(model_dir: str | os.PathLike[str] | None = None) -> Engine:
    """The reference engine on ``model_dir`` (a fixture name or a directory: the plugin passes
    ``--prefixcache-model``'s), else on :func:`env_model_path` (the plugin's default engine):
    the tiny Qwen2-VL unless ``PREFIXCACHE_MODEL`` names another (vision-language) model.

    Every call is a fresh engine (its own block pool, vision cache and snapshots) on the
    process's one load of the model (:func:`~reference_engine.model.shared_model`): the
    baseline audit's fresh instances cost a new cache, not a new load.

    With ``PREFIXCACHE_REFERENCE_DISK`` set (``--prefixcache-restarts`` sets it), each engine
    gets a disk tier in a directory of its own under it: fresh instances share nothing."""
    path = env_model_path() if model_dir is None else resolve_model(model_dir)
    model = require_model(path, vision=True, who="the reference engine")
    disk = os.environ.get("PREFIXCACHE_REFERENCE_DISK")
    cache_dir = tempfile.mkdtemp(prefix="engine-", dir=disk) if disk else None
    return Engine(shared_model(model), cache_dir=cache_dir)
