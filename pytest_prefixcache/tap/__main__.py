"""``python -m pytest_prefixcache.tap MODULE:FUNC ARGS...``: run a server with the tap installed.

Records go to ``$PREFIXCACHE_TAP``; ``$PREFIXCACHE_TAP_TARGETS`` (comma-separated
``module:Class``) replaces the default list of wrapped classes.
"""

from __future__ import annotations

import importlib
import os
import sys

from . import ENV
from .wrap import DEFAULT_TARGETS, install


def main(argv: list[str]) -> int:
    if not argv or ":" not in argv[0]:
        print("usage: python -m pytest_prefixcache.tap MODULE:FUNC [ARGS...]", file=sys.stderr)
        return 2
    if not os.environ.get(ENV):
        print(f"error: set ${ENV} to the file the tap records go to", file=sys.stderr)
        return 2
    targets = os.environ.get("PREFIXCACHE_TAP_TARGETS")
    wrapped = install(targets=targets.split(",") if targets else DEFAULT_TARGETS)
    print(f"prefixcache tap: wrapped {', '.join(wrapped) or 'nothing'}", file=sys.stderr)
    module, _, func = argv[0].partition(":")
    sys.argv = [module, *argv[1:]]
    result = getattr(importlib.import_module(module), func)()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
