"""Engine configurations of one run (the matrix): where they come from and how they are named.

A :class:`Target` is one configuration: an engine (``MODULE:ATTR``) or a server command, the
keyword arguments and flags its factory gets (or the flags appended to its command), the
environment it runs in, and the options it overrides. Several come from repeated
``--prefixcache-engine``/``--prefixcache-server-cmd`` flags or a matrix file
(:mod:`.matrix_file`); ``--prefixcache-config NAME`` selects some of them.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..package_data import MODEL_ENV
from .values import engine_spec, server_cmd

__all__ = [
    "NAME",
    "SERVER_ENGINE",
    "Target",
    "from_flags",
    "named_engine",
    "named_server_cmd",
    "select",
    "unnamed",
]

#: A configuration's name (and a flag label's).
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
#: The factory that builds the OpenAI-compatible adapter from PREFIXCACHE_* variables.
SERVER_ENGINE = "pytest_prefixcache.adapters.presets:from_env"
_NAMED = re.compile(r"^([A-Za-z0-9_.-]+)=(.*)$", re.S)


@dataclass(frozen=True)
class Target:
    """One engine configuration of a matrix run."""

    name: str
    base: str
    """The name before any flag labels (``vllm-mlx`` of ``vllm-mlx[cb,paged]``)."""
    engine: str
    """``MODULE:ATTR``; :data:`SERVER_ENGINE` for a server command."""
    source: str
    """``option``, ``--prefixcache-server-cmd`` or ``matrix`` (where it was given)."""
    server_cmd: str | None = None
    """The command as given (flags not appended)."""
    args: dict[str, Any] = field(default_factory=dict)
    flags: tuple[str, ...] | None = None
    """This combination's flags (None: the configuration has no flag product)."""
    env: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    """examples, timeout, atol, rtol, kl, server_body (a JSON string), model (an absolute
    directory, exported as PREFIXCACHE_MODEL) for this one."""
    matrix: Path | None = None

    @property
    def command(self) -> str | None:
        """The server command with this combination's flags appended."""
        if self.server_cmd is None:
            return None
        return " ".join(
            [self.server_cmd, shlex.join(self.flags)] if self.flags else [self.server_cmd]
        )

    def factory_kwargs(self) -> dict[str, Any]:
        """What an engine factory is called with."""
        kwargs = dict(self.args)
        if self.flags is not None and self.server_cmd is None:
            kwargs["flags"] = list(self.flags)
        return kwargs

    def environment(self) -> dict[str, str]:
        """Variables set while this configuration's engine is built and run."""
        env = dict(self.env)
        if "model" in self.overrides:
            env[MODEL_ENV] = self.overrides["model"]
        if self.command is not None:
            env["PREFIXCACHE_SERVER_CMD"] = self.command
            body = self.overrides.get("server_body")
            if body is not None:
                env["PREFIXCACHE_EXTRA_BODY"] = body
        return env

    def describe(self) -> str:
        """The engine as the report names it."""
        if self.command is not None:
            return f"{self.engine} serving {self.command}"
        extra = [f"{k}={v!r}" for k, v in self.args.items()]
        if self.flags is not None:
            extra.append(f"flags={list(self.flags)!r}")
        return f"{self.engine}({', '.join(extra)})" if extra else self.engine


def _split_name(value: str) -> tuple[str | None, str]:
    m = _NAMED.match(value)
    if m and " " not in m.group(1):
        return m.group(1), m.group(2)
    return None, value


def unnamed(value: str) -> str:
    """A flag's value without its ``NAME=``."""
    return _split_name(value)[1]


def named_engine(value: str) -> str:
    """``--prefixcache-engine``'s value: ``MODULE:ATTR`` or ``NAME=MODULE:ATTR``."""
    _, spec = _split_name(value)
    engine_spec(spec)
    return value


def named_server_cmd(value: str) -> str:
    """``--prefixcache-server-cmd``'s value: ``CMD`` or ``NAME=CMD`` (CMD has ``{port}``)."""
    _, cmd = _split_name(value)
    server_cmd(cmd)
    return value


def _server_name(cmd: str) -> str:
    """A readable name for a server command: its program (or script) without the path."""
    try:
        words = shlex.split(cmd)
    except ValueError:
        words = cmd.split()
    for w in words:
        stem = os.path.splitext(os.path.basename(w))[0]
        if not stem.startswith("python") and NAME.match(stem) and "{" not in w:
            return stem
    return "server"


def from_flags(engines: Sequence[str], servers: Sequence[str], body: str | None) -> list[Target]:
    """One configuration per repeated flag, named by ``NAME=`` or after the attribute (or
    the server's program); a name taken twice gets ``-2``, ``-3``, ... (an explicit name
    given twice is an error)."""
    out: list[Target] = []
    explicit: set[str] = set()
    for kind, values in (("option", engines), ("--prefixcache-server-cmd", servers)):
        for value in values:
            name, spec = _split_name(value)
            if name is not None and name in explicit:
                raise argparse.ArgumentTypeError(f"configuration name {name!r} is given twice")
            if name is not None:
                explicit.add(name)
            if kind == "option":
                auto = spec.rpartition(":")[2].rpartition(".")[2]
                target = Target(name or auto, name or auto, spec, kind)
            else:
                auto = _server_name(spec)
                over = {} if body is None else {"server_body": body}
                target = Target(
                    name or auto, name or auto, SERVER_ENGINE, kind, spec, overrides=over
                )
            out.append(target)
    return _unique(out, explicit)


def _unique(targets: list[Target], explicit: set[str]) -> list[Target]:
    taken = {t.name for t in targets if t.name in explicit}
    out = []
    for t in targets:
        if t.name in explicit:
            out.append(t)
            continue
        name, n = t.name, 1
        while name in taken:
            n += 1
            name = f"{t.name}-{n}"
        taken.add(name)
        out.append(Target(name, name, t.engine, t.source, t.server_cmd, overrides=t.overrides))
    return out


def select(targets: Sequence[Target], names: Sequence[str]) -> list[Target]:
    """The configurations ``--prefixcache-config`` names (exact, or a base name for all its
    combinations), in their own order; an unknown name raises ArgumentTypeError."""
    if not names:
        return list(targets)
    known = {t.name for t in targets} | {t.base for t in targets}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"--prefixcache-config {', '.join(map(repr, unknown))}: no such configuration; "
            f"the configurations are: {', '.join(t.name for t in targets)}"
        )
    return [t for t in targets if t.name in names or t.base in names]
