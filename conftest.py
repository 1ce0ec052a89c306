"""Outer conftest: import mlx.core before any in-process pytester run (see NOTES on pytester),
and give the test run a temporary directory of its own that it removes at the end.

pytester drops modules first imported inside ``runpytest()`` from sys.modules afterwards, and
re-importing mlx.core in the same interpreter aborts it; importing it here keeps it loaded.

Everything the run puts in the temp directory (pytest's basetemp and pytester's runs, MLX's
compiled CPU kernels under ``$TMPDIR/mlx``, servers' private homes, anything a subprocess
writes) lands in one ``prefixcache-tests-*`` directory, removed when the run ends. An explicit
``--basetemp`` keeps pytest's own behaviour (and its directories).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:
    import mlx.core  # noqa: F401
except ImportError:  # the plugin works without MLX; engine tests skip themselves
    pass


#: Set in the environment of the run that owns the private temp directory, so that its xdist
#: workers and subprocesses use it and leave its removal to the owner.
_OWNED = "PREFIXCACHE_TESTS_TMPDIR"
_root: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _root
    if config.option.basetemp is not None or os.environ.get(_OWNED):
        return
    _root = tempfile.mkdtemp(prefix="prefixcache-tests-")
    os.environ["TMPDIR"] = os.environ[_OWNED] = _root
    tempfile.tempdir = _root


def pytest_unconfigure(config: pytest.Config) -> None:
    """Drain MLX's streams from the main thread before the interpreter exits: tests run MLX
    on other threads (the plugin's worker, the concurrency test), and without this MLX 0.32
    on CPU sometimes aborts at exit (see pytest_prefixcache.verify.worker._drain_mlx)."""
    import sys

    mx = sys.modules.get("mlx.core")
    if mx is not None:
        mx.synchronize()
    if _root is not None:
        shutil.rmtree(_root, ignore_errors=True)
