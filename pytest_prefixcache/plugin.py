"""pytest hooks for pytest-prefixcache (options and wiring only; see the other modules)."""

from __future__ import annotations
