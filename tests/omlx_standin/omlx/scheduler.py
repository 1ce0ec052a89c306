"""The stand-in's ``SchedulerConfig``: the one field the launcher's ``--block-size`` sets."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerConfig:
    paged_cache_block_size: int = 256  # oMLX's default (scheduler.py)
    hot_cache_only: bool = False
