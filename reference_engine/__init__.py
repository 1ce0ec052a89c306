"""The reference engine: an MLX engine with a segmented multimodal prefix cache done right.

Chained block hashes with image digests, reuse up to the first changed image, bit-exact
against a cold run. Importing this package imports MLX.
"""

from __future__ import annotations

from .engine import DEFAULT_MAX_BYTES, Engine, EngineStats, default_model_path

__all__ = ["DEFAULT_MAX_BYTES", "Engine", "EngineStats", "default_engine", "default_model_path"]


def default_engine() -> Engine:
    """The reference engine on the tiny Qwen2-VL fixture (the plugin's default engine)."""
    return Engine.from_pretrained(default_model_path())
