"""Which engine a session verifies: one (``--prefixcache-engine``, ``--prefixcache-server-cmd``,
the ini key, or the default), or several configurations (a matrix: repeated flags and/or a
matrix file, selected by ``--prefixcache-config``). The plugin and the ``prefixcache`` command
resolve them here, so both refuse the same mistakes with the same words."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from .matrix_file import MatrixError, read_matrix
from .targets import Target, from_flags, select

__all__ = ["SourceError", "is_matrix_run", "resolve_targets"]


class SourceError(ValueError):
    """Engine options that do not name a usable set of configurations."""


def is_matrix_run(
    engines: Sequence[str], servers: Sequence[str], matrix: str | None, names: Sequence[str]
) -> bool:
    """Whether the options name several configurations (raises on a contradiction)."""
    if matrix is not None or len(engines) > 1 or len(servers) > 1:
        return True
    if engines and servers:
        raise SourceError(
            "--prefixcache-server-cmd and --prefixcache-engine both name the engine; give one "
            "(or several configurations: repeat the flags, or --prefixcache-matrix FILE)"
        )
    if names:
        raise SourceError(
            "--prefixcache-config selects among several configurations (repeated "
            "--prefixcache-engine/--prefixcache-server-cmd, or --prefixcache-matrix FILE)"
        )
    return False


def resolve_targets(
    engines: Sequence[str],
    servers: Sequence[str],
    body: str | None,
    matrix: str | None,
    names: Sequence[str],
    invocation_dir: Path,
) -> list[Target]:
    """The configurations of a matrix run, in order: the flags', then the file's; the
    selected ones when ``names`` is given."""
    try:
        found = from_flags(engines, servers, body)
        if matrix is not None:
            path = Path(matrix)
            full = path if path.is_absolute() else invocation_dir / path
            found += [replace(t, matrix=path) for t in read_matrix(full)]
        seen = [t.name for t in found]
        twice = sorted({n for n in seen if seen.count(n) > 1})
        if twice:
            raise SourceError(f"configuration name(s) given twice: {', '.join(twice)}")
        return select(found, names)
    except (MatrixError, argparse.ArgumentTypeError) as exc:
        raise SourceError(str(exc)) from None
