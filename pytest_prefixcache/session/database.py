"""Hypothesis's example database for the generated tests: failing examples are saved and
replayed first by the next run, on this machine (a directory) or on every machine that points
at the same Redis server (``--prefixcache-database=redis://HOST:PORT/DB``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import PrefixCacheError

__all__ = ["DatabaseError", "example_database"]

#: Seconds to wait for a Redis server before the session fails with a usage error.
REDIS_TIMEOUT = 5.0


class DatabaseError(PrefixCacheError):
    """The example database named by --prefixcache-database cannot be used."""


def _redis(url: str) -> Any:
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as exc:
        raise DatabaseError(
            f"--prefixcache-database={url} needs the redis package "
            f"(pip install 'pytest-prefixcache[redis]'): {exc}"
        ) from None
    client = redis.Redis.from_url(
        url, socket_connect_timeout=REDIS_TIMEOUT, socket_timeout=REDIS_TIMEOUT * 2
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        raise DatabaseError(f"--prefixcache-database={url}: cannot reach Redis: {exc}") from None
    return RedisExampleDatabase(client, key_prefix=b"pytest-prefixcache:")


def example_database(spec: str, base: Path) -> Any:
    """The database for ``spec`` ("none", a redis URL or a directory relative to ``base``)."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    if spec == "none":
        return None
    if "://" in spec:
        return _redis(spec)
    path = Path(os.path.expanduser(spec))
    path = path if path.is_absolute() else base / path
    if path.exists() and not path.is_dir():
        raise DatabaseError(f"--prefixcache-database={spec}: {path} is a file, not a directory")
    return DirectoryBasedExampleDatabase(str(path))
