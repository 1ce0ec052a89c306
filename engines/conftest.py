"""The lab's tests: the engine folders' opt-in tests (skipped unless their engine script runs
them) and the unit tests of the findings scripts. ``lab`` (this folder) and ``tests`` (for the
request builders of tests/adapter_support.py) are importable from them."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
