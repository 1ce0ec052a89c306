"""The verification suite that ``--prefixcache-verify`` adds to the session.

Its module is named ``verification.py`` (not ``test_*.py``) so that pytest never collects it
unless the plugin adds it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ISOLATION_FILE", "RESTARTS_FILE", "SUITE_FILE"]

SUITE_FILE = Path(__file__).with_name("verification.py")
ISOLATION_FILE = Path(__file__).with_name("isolation.py")
"""Collected only with ``--prefixcache-isolation``."""
RESTARTS_FILE = Path(__file__).with_name("restarts.py")
"""Collected only with ``--prefixcache-restarts``."""
