"""The checks: pure functions from outcomes to problems.

Each check returns a list of :class:`Problem` (or one, or none); the verifier
(:mod:`pytest_prefixcache.verify`) runs them per request and turns the first into a readable
failure.
"""

from __future__ import annotations

from .problem import Problem

__all__ = ["Problem"]
