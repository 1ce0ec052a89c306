"""pytest-prefixcache: fuzz an inference engine's KV prefix cache against cold runs.

Importing this package is cheap: it never imports MLX or the reference engine.
"""

from __future__ import annotations

from .errors import EngineError, ImageError, PrefixCacheError, RequestError
from .types import Engine, Image, Message, Outcome, Request

__version__ = "0.1.0"

__all__ = [
    "Engine",
    "EngineError",
    "Image",
    "ImageError",
    "Message",
    "Outcome",
    "PrefixCacheError",
    "Request",
    "RequestError",
    "__version__",
]
