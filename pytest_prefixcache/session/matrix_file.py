"""The matrix file (``--prefixcache-matrix FILE``): named engine configurations in TOML.

::

    [defaults]                 # optional; per-config keys override these
    timeout = 300              # any of: examples, timeout, atol, rtol, kl, server_body (table),
                               # model (a fixture name, or a directory relative to this file)

    [[config]]
    name = "reference"                      # required, unique, [A-Za-z0-9_.-]+
    engine = "reference_engine:Engine"      # MODULE:ATTR, or server_cmd = "cmd {port} ...": one
    args = { size = "tiny" }                # keyword arguments for an engine factory
    env = { SOME_VAR = "1" }                # set while this config's engine is built and run
    examples = 10                           # overrides, the names of [defaults]

    [config.flags]                          # the product over flag sets
    batching = { simple = "", cb = "--continuous-batching" }
    [[config.exclude]]                      # drop the combinations matching all its pairs
    batching = "simple"

Every mistake is a :class:`MatrixError` naming the file, the configuration and the key.
"""

from __future__ import annotations

import itertools
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest depends on tomli before 3.11
    import tomli as tomllib

from ..errors import EngineError
from ..package_data import resolve_model
from .targets import NAME, SERVER_ENGINE, Target
from .values import ENGINE_SPEC

__all__ = ["MatrixError", "read_matrix"]

OPTION_KEYS = ("examples", "timeout", "atol", "rtol", "kl", "server_body", "model")
CONFIG_KEYS = ("name", "engine", "server_cmd", "args", "env", "flags", "exclude", *OPTION_KEYS)


class MatrixError(ValueError):
    """A matrix file that cannot be used (the message names the file, config and key)."""


class _Where:
    def __init__(self, path: Path, config: str | None = None) -> None:
        self.path, self.config = path, config

    def error(self, key: str | None, what: str) -> MatrixError:
        parts = [str(self.path)]
        if self.config is not None:
            parts.append(f"config {self.config!r}")
        if key is not None:
            parts.append(f"key {key!r}")
        return MatrixError(f"{': '.join(parts)}: {what}")


def _number(where: _Where, key: str, value: Any) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if key == "examples":
        if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise where.error(key, f"{value!r} is not a positive integer")
    elif key == "timeout" and not (ok and value > 0):
        raise where.error(key, f"{value!r} is not a positive number of seconds")
    elif key in ("atol", "rtol", "kl") and not (ok and value >= 0):
        raise where.error(key, f"{value!r} is not a finite number >= 0")


def _options(where: _Where, table: dict[str, Any]) -> dict[str, Any]:
    """The option overrides of one table, validated (server_body as a JSON string, model as
    an absolute directory)."""
    out: dict[str, Any] = {}
    for key in OPTION_KEYS:
        if key not in table:
            continue
        value = table[key]
        if key == "server_body":
            if not isinstance(value, dict):
                raise where.error(key, f"{value!r} is not a table")
            out[key] = json.dumps(value)
        elif key == "model":
            if not isinstance(value, str):
                raise where.error(key, f"{value!r} is not a string")
            try:
                out[key] = str(resolve_model(value, where.path.parent))
            except EngineError as exc:
                raise where.error(key, str(exc)) from None
        else:
            _number(where, key, value)
            out[key] = float(value) if key != "examples" else value
    return out


def _table(where: _Where, key: str, value: Any, of_strings: bool = False) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise where.error(key, f"{value!r} is not a table")
    if of_strings:
        for k, v in value.items():
            if not isinstance(v, str):
                raise where.error(f"{key}.{k}", f"{v!r} is not a string")
    return value


def _product(
    where: _Where, flags: dict[str, Any], excludes: list[Any]
) -> list[tuple[list[str], tuple[str, ...]]]:
    """(labels, flags) of every combination left after the exclusions."""
    dims: list[tuple[str, dict[str, str]]] = []
    for dim, labels in flags.items():
        table = _table(where, f"flags.{dim}", labels, of_strings=True)
        for label in table:
            if not NAME.match(label):
                raise where.error(f"flags.{dim}", f"label {label!r} is not [A-Za-z0-9_.-]+")
        dims.append((dim, table))
    rules: list[dict[str, str]] = []
    for i, rule in enumerate(excludes):
        key = f"exclude[{i}]"
        rule = _table(where, key, rule, of_strings=True)
        for dim, label in rule.items():
            if dim not in flags:
                raise where.error(key, f"unknown dimension {dim!r} (the dimensions: {list(flags)})")
            if label not in flags[dim]:
                raise where.error(
                    f"{key}.{dim}", f"unknown label {label!r} (the labels: {list(flags[dim])})"
                )
        if not rule:
            raise where.error(key, "an empty exclusion would drop every combination")
        rules.append(rule)
    out = []
    for combo in itertools.product(*(list(t.items()) for _, t in dims)):
        chosen = {dim: label for (dim, _), (label, _) in zip(dims, combo, strict=True)}
        if any(all(chosen[d] == lab for d, lab in r.items()) for r in rules):
            continue
        words = [w for _, text in combo for w in shlex.split(text)]
        out.append(([label for label, _ in combo], tuple(words)))
    if not out:
        raise where.error("flags", "the product of the flag sets is empty (after exclude)")
    return out


def _config(path: Path, i: int, entry: Any, defaults: dict[str, Any]) -> list[Target]:
    where = _Where(path, f"#{i + 1}")
    if not isinstance(entry, dict):
        raise where.error(None, f"[[config]] #{i + 1} is not a table")
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise where.error("name", f"{name!r} is not a name of [A-Za-z0-9_.-]+ (required)")
    where = _Where(path, name)
    for key in entry:
        if key not in CONFIG_KEYS:
            raise where.error(key, f"unknown key (the keys: {', '.join(CONFIG_KEYS)})")
    engine, cmd = entry.get("engine"), entry.get("server_cmd")
    if (engine is None) == (cmd is None):
        raise where.error("engine", "give exactly one of engine and server_cmd")
    if engine is not None and not (isinstance(engine, str) and ENGINE_SPEC.match(engine)):
        raise where.error("engine", f"{engine!r} is not MODULE:ATTR")
    if cmd is not None and not (isinstance(cmd, str) and "{port}" in cmd):
        raise where.error("server_cmd", f"{cmd!r} is not a command with a {{port}} placeholder")
    args = _table(where, "args", entry.get("args", {}))
    if args and cmd is not None:
        raise where.error("args", "keyword arguments are for an engine factory, not server_cmd")
    env = _table(where, "env", entry.get("env", {}), of_strings=True)
    over = {**defaults, **_options(where, entry)}
    if cmd is None:
        if "server_body" in entry:
            raise where.error("server_body", "a request body is for server_cmd configurations")
        over.pop("server_body", None)
    flags = entry.get("flags")
    excludes = entry.get("exclude", [])
    if not isinstance(excludes, list):
        raise where.error("exclude", "is not an array of tables ([[config.exclude]])")
    if flags is None:
        if excludes:
            raise where.error("exclude", "there is no [config.flags] to exclude from")
        return [
            Target(name, name, engine or SERVER_ENGINE, "matrix", cmd, args, None, env, over, path)
        ]
    out = []
    for labels, words in _product(where, _table(where, "flags", flags), excludes):
        full = f"{name}[{','.join(labels)}]"
        out.append(
            Target(full, name, engine or SERVER_ENGINE, "matrix", cmd, args, words, env, over, path)
        )
    return out


def read_matrix(path: Path) -> list[Target]:
    """Every configuration of the matrix file at ``path``, in file order."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise MatrixError(f"{path}: cannot read the matrix file: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise MatrixError(f"{path}: not valid TOML: {exc}") from None
    top = _Where(path)
    for key in data:
        if key not in ("defaults", "config"):
            raise top.error(key, "unknown key (the keys: defaults, config)")
    defaults = _table(top, "defaults", data.get("defaults", {}))
    for key in defaults:
        if key not in OPTION_KEYS:
            raise top.error(f"defaults.{key}", f"unknown key (the keys: {', '.join(OPTION_KEYS)})")
    base = _options(top, defaults)
    configs = data.get("config")
    if not isinstance(configs, list) or not configs:
        raise top.error("config", "no [[config]] tables")
    out: list[Target] = []
    for i, entry in enumerate(configs):
        targets = _config(path, i, entry, base)
        if any(t.base == targets[0].base for t in out):
            raise _Where(path, targets[0].base).error("name", "the name is given twice")
        out.extend(targets)
    return out
