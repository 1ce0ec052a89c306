"""The exception hierarchy: one root, and input errors that name what was wrong."""

from __future__ import annotations

__all__ = ["EngineError", "ImageError", "PrefixCacheError", "RequestError"]


class PrefixCacheError(Exception):
    """Root of every error pytest-prefixcache raises on purpose."""


class ImageError(PrefixCacheError, ValueError):
    """An image could not be decoded or is outside the supported limits."""


class RequestError(PrefixCacheError, ValueError):
    """A Message or Request was built from invalid parts."""


class EngineError(PrefixCacheError):
    """An engine could not be loaded, or returned something outside the protocol."""
