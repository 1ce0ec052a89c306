"""``python -m pytest_prefixcache.tap MODULE:FUNC ARGS...``: run a server with the tap installed.

Records go to ``$PREFIXCACHE_TAP``; ``$PREFIXCACHE_TAP_TARGETS`` (comma-separated
``module:Class``) replaces the default list of wrapped classes. Once the server's module is
imported, the scheduler hooks of :mod:`.identity` label each batch row with its request
(``$PREFIXCACHE_TAP_IDENTITY=0``: not installed, the rows unlabelled).
"""

from __future__ import annotations

import importlib
import os
import sys

from . import ENV, IDENTITY_ENV, TARGETS_ENV
from .wrap import DEFAULT_TARGETS, install, install_identity


def main(argv: list[str]) -> int:
    if not argv or ":" not in argv[0]:
        print("usage: python -m pytest_prefixcache.tap MODULE:FUNC [ARGS...]", file=sys.stderr)
        return 2
    if not os.environ.get(ENV):
        print(f"error: set ${ENV} to the file the tap records go to", file=sys.stderr)
        return 2
    targets = os.environ.get(TARGETS_ENV)
    chosen = [t.strip() for t in targets.split(",") if t.strip()] if targets else DEFAULT_TARGETS
    bad = [t for t in chosen if ":" not in t]
    if bad:
        print(f"error: ${TARGETS_ENV}: {bad[0]!r} is not module:Class", file=sys.stderr)
        return 2
    wrapped = install(targets=chosen)
    print(f"prefixcache tap: wrapped {', '.join(wrapped) or 'nothing'}", file=sys.stderr)
    module, _, func = argv[0].partition(":")
    sys.argv = [module, *argv[1:]]
    entry = getattr(importlib.import_module(module), func)
    # the scheduler's classes are imported by now; =0 keeps the rows unlabelled (the ledger
    # then infers, as for an unknown server: the comparison's control)
    labelled = install_identity() if os.environ.get(IDENTITY_ENV) != "0" else []
    if labelled:
        print(f"prefixcache tap: batch rows labelled by {', '.join(labelled)}", file=sys.stderr)
    result = entry()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
