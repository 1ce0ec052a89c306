"""Outer conftest: import mlx.core before any in-process pytester run (see NOTES on pytester).

pytester drops modules first imported inside ``runpytest()`` from sys.modules afterwards, and
re-importing mlx.core in the same interpreter aborts it; importing it here keeps it loaded.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:
    import mlx.core  # noqa: F401
except ImportError:  # the plugin works without MLX; engine tests skip themselves
    pass


def pytest_unconfigure(config: object) -> None:
    """Drain MLX's streams from the main thread before the interpreter exits: tests run MLX
    on other threads (the plugin's worker, the concurrency test), and without this MLX 0.32
    on CPU sometimes aborts at exit (see pytest_prefixcache.verify.worker._drain_mlx)."""
    import sys

    mx = sys.modules.get("mlx.core")
    if mx is not None:
        mx.synchronize()
