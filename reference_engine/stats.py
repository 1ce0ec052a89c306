"""The reference engine's cache counters since its last reset (``Engine.stats``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineStats"]


@dataclass(frozen=True)
class EngineStats:
    """Cache counters since the last reset."""

    requests: int
    lookups: int
    hit_tokens: int
    prompt_tokens: int
    stored_blocks: int
    evictions: int
    resident_bytes: int
    resident_blocks: int
    vision_encoded: int
    vision_hits: int
    snapshots_stored: int = 0
    snapshot_hits: int = 0
    disk_restored: int = 0
    """Blocks brought back from the disk tier."""
    disk_torn: int = 0
    """Disk files found torn or truncated: never served, counted as misses."""
