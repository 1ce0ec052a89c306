"""Hypothesis strategies for prefix-cache testing: images, image pools, conversations,
request streams and waves of concurrent requests.

Every strategy is keyword-only and validates its arguments when it is built, raising
``hypothesis.errors.InvalidArgument`` that repeats the bad value. Images are drawn as small
specs (pattern, size, seed) rendered deterministically, so examples are cheap to generate
and shrink well.

The public names live here; the private modules hold the rest (``_args``: the argument checks
the strategies share; ``_images``, ``_streams``, ``_waves``: the strategies; ``_moves``: the
moves that turn a stream into its next request; ``_restarts``: restarts between requests;
``_engine``: the arguments that keep the strategies within one engine's capabilities).
"""

from __future__ import annotations

from ._engine import stream_kwargs, wave_kwargs
from ._images import image_pools, images
from ._moves import MOVES
from ._restarts import Restart, restart_streams
from ._streams import CLOSED_LOOP_SHARE, conversations, request_streams
from ._waves import ARRIVALS, request_waves

__all__ = [
    "ARRIVALS",
    "CLOSED_LOOP_SHARE",
    "MOVES",
    "Restart",
    "conversations",
    "image_pools",
    "images",
    "request_streams",
    "request_waves",
    "restart_streams",
    "stream_kwargs",
    "wave_kwargs",
]
