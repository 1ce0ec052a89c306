"""The reference engine's cache counters since its last reset (``Engine.stats``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Counters", "EngineStats"]


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


class Counters:
    """The engine's counters and usage, for inspection and the plugin's memory-budget check
    (a mixin of ``Engine``: the attributes below are the engine's)."""

    pool: Any
    kv: Any
    vision: Any
    disk: Any
    disk_restored: int
    _requests: int
    _hit_tokens: int
    _prompt_tokens: int
    _snapshots_stored: int
    _snapshot_hits: int

    @property
    def stats(self) -> EngineStats:
        ps = self.pool.stats
        return EngineStats(
            requests=self._requests,
            lookups=ps.lookups,
            hit_tokens=self._hit_tokens,
            prompt_tokens=self._prompt_tokens,
            stored_blocks=ps.stored_blocks,
            evictions=ps.evictions,
            resident_bytes=self.pool.resident_bytes,
            resident_blocks=len(self.pool),
            vision_encoded=self.vision.encoded,
            vision_hits=self.vision.hits,
            snapshots_stored=self._snapshots_stored,
            snapshot_hits=self._snapshot_hits,
            disk_restored=self.disk_restored,
            disk_torn=0 if self.disk is None else self.disk.stats.torn,
        )

    @property
    def segments(self) -> Any:
        """The KV store's segments and their windows (for inspection)."""
        return self.kv.segments

    def cache_usage(self) -> dict[str, int]:
        """Memory of the block pool, for the plugin's memory-budget check."""
        return {
            "resident_bytes": self.pool.resident_bytes,
            "entries": len(self.pool),
            "max_bytes": self.pool.max_bytes,
        }
