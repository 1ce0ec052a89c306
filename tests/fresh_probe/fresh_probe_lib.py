"""State a library keeps across requests, imported by the fork server before it forks.

``CACHE_DIR`` is computed at import time from HOME, as libraries compute their cache paths, so
in a forked server it points into the fork server's HOME; ``SERVED`` lists the requests this
process has answered.
"""

from __future__ import annotations

import os

CACHE_DIR = os.path.join(os.environ.get("HOME", "."), "probe-cache")
SERVED: list[str] = []
