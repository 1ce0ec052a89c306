"""Which engine a session verifies: one (``--prefixcache-engine``, ``--prefixcache-server-cmd``,
the ini key, or the default), or several configurations (a matrix: repeated flags and/or a
matrix file, selected by ``--prefixcache-config``), and which model its factories load
(``--prefixcache-model``, the ini key, ``PREFIXCACHE_MODEL``). The plugin and the
``prefixcache`` command resolve them here, so both refuse the same mistakes with the same
words."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from ..errors import EngineError
from ..package_data import MODEL_ENV, resolve_model
from . import settings
from .matrix_file import MatrixError, read_matrix
from .targets import SERVER_ENGINE, Target, from_flags, select, unnamed

__all__ = [
    "SERVER_SOURCE",
    "SourceError",
    "engine_of",
    "is_matrix_run",
    "model_of",
    "resolve_targets",
]

SERVER_SOURCE = "--prefixcache-server-cmd"


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


def engine_of(config: pytest.Config) -> tuple[str, str, list[Target] | None]:
    """The session's engine and where it was named (option, server command, ini, default);
    for several configurations (a matrix): ``("matrix", "matrix", targets)``."""
    engines = config.getoption("prefixcache_engine") or []
    servers = config.getoption("prefixcache_server_cmd") or []
    body = config.getoption("prefixcache_server_body")
    if body is not None and not servers:
        raise pytest.UsageError("--prefixcache-server-body needs --prefixcache-server-cmd")
    matrix, names = config.getoption("prefixcache_matrix"), config.getoption("prefixcache_config")
    try:
        if is_matrix_run(engines, servers, matrix, names or []):
            found = resolve_targets(
                engines, servers, body, matrix, names or [], config.invocation_params.dir
            )
            return "matrix", "matrix", found
    except SourceError as exc:
        raise pytest.UsageError(str(exc)) from None
    if engines:
        return unnamed(engines[0]), "option", None
    if servers:
        # read by the zero-argument factory when the engine is built
        os.environ["PREFIXCACHE_SERVER_CMD"] = unnamed(servers[0])
        if body is not None:
            os.environ["PREFIXCACHE_EXTRA_BODY"] = body
        return SERVER_ENGINE, SERVER_SOURCE, None
    ini = config.getini("prefixcache_engine")
    if ini:
        ini = str(ini).strip()
        try:
            return settings.engine_spec(ini), "ini", None
        except Exception as exc:
            where = config.inipath or "the ini file"
            raise pytest.UsageError(f"prefixcache_engine in {where}: {exc}") from None
    return settings.DEFAULT_ENGINE, "default", None


def model_of(config: pytest.Config) -> tuple[str | None, str]:
    """The session's model directory (absolute) and where it was named: the option (resolved
    against the invocation directory when it was parsed), the ini key (against the ini file's
    directory), ``PREFIXCACHE_MODEL`` when it names a fixture or a directory, else
    ``(None, "default")``: each engine loads its own. A variable that names neither is left
    alone (a served model's name for ``presets.from_env``; an engine that needs a directory
    says so when it is built)."""
    given = config.getoption("prefixcache_model")
    if given is not None:
        return str(given), "option"
    ini = config.getini("prefixcache_model")
    if ini:
        ini = str(ini).strip()
        base = config.inipath.parent if config.inipath else config.rootpath
        try:
            return settings.model_dir(ini, base), "ini"
        except argparse.ArgumentTypeError as exc:
            where = config.inipath or "the ini file"
            raise pytest.UsageError(f"prefixcache_model in {where}: {exc}") from None
    env = os.environ.get(MODEL_ENV, "").strip()
    if env:
        try:
            return str(resolve_model(env, config.invocation_params.dir)), MODEL_ENV
        except EngineError:
            pass
    return None, "default"
