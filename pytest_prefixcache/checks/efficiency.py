"""Stream-level checks, after a stream's last request: the opt-in floors on cache efficiency
(``--prefixcache-min-efficiency``) and on the speedup of cache hits
(``--prefixcache-min-speedup``)."""

from __future__ import annotations

from .problem import Problem

__all__ = ["efficiency_problem", "speedup_problem"]


def efficiency_problem(reused: int, reusable: int, floor: float) -> Problem | None:
    """A problem when the stream reused less than ``floor`` of what the oracle allowed."""
    eff = reused / reusable
    if eff >= floor:
        return None
    head = (
        f"the cache reused {reused} of {reusable} reusable tokens ({eff:.1%}), below "
        f"--prefixcache-min-efficiency={floor:g}"
    )
    why = "the cache invalidates more than it must (re-rendered history, coarse keys?)"
    return Problem("min efficiency", head, (why,))


def speedup_problem(warm: float, cold: float, speedup: float) -> Problem | None:
    """A problem when cache hits took ``warm`` seconds against ``cold``, below ``speedup``."""
    got = cold / warm
    if got >= speedup:
        return None
    head = (
        f"requests served from the cache took {warm:.3f} s against {cold:.3f} s cold "
        f"(speedup {got:.2f}x), below --prefixcache-min-speedup={speedup:g}"
    )
    why = "restoring or managing the cache costs more than the prefill it saves"
    return Problem("min speedup", head, (why,))
