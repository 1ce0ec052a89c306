"""The settings' values: the validators (``type=`` functions of the options, also applied to
matrix files) and the defaults. Below both :mod:`.settings` and :mod:`.option_table`, so that the
table reads them without importing the settings that import the table.

Every validator's error repeats the bad value, e.g. ``'abc' is not a positive integer``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

from ..errors import EngineError
from ..package_data import resolve_model

__all__ = [
    "DEFAULT_DATABASE",
    "DEFAULT_ENGINE",
    "DEFAULT_EXAMPLES",
    "DEFAULT_PARALLEL_STREAMS",
    "DEFAULT_PROGRESS",
    "DEFAULT_SHRINK_BUDGET",
    "DEFAULT_TOLERANCE",
    "ENGINE_SPEC",
    "STATEFUL_STEPS",
    "database_spec",
    "engine_spec",
    "fraction",
    "model_dir",
    "non_negative_float",
    "positive_float",
    "positive_int",
    "positive_ratio",
    "seed",
    "server_body",
    "server_cmd",
    "shrink_budget",
]

DEFAULT_ENGINE = "reference_engine:default_engine"
DEFAULT_EXAMPLES = 100
DEFAULT_DATABASE = ".prefixcache/examples"
#: ``atol`` and ``rtol``: exact agreement unless a rule or an option allows more.
DEFAULT_TOLERANCE = 0.0
DEFAULT_PARALLEL_STREAMS = 1
#: Examples a failing property may run after its first failure, as a share of its examples
#: (so a failing property runs at most twice a passing one's; ``verify.shrink_budget``).
DEFAULT_SHRINK_BUDGET = 1.0
#: Seconds between progress lines.
DEFAULT_PROGRESS = 30.0
#: Steps per state-machine example (the state machine runs DEFAULT_EXAMPLES // 2 examples).
STATEFUL_STEPS = 8
#: ``MODULE:ATTR``, dotted on both sides: an engine factory.
ENGINE_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer")
    return n


def seed(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if not 0 <= n < 2**63:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer from 0 to 2**63 - 1")
    return n


def _float(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return math.nan


def positive_float(value: str) -> float:
    x = _float(value)
    if not (x > 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number of seconds")
    return x


def positive_ratio(value: str) -> float:
    x = _float(value)
    if not (x > 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number")
    return x


def non_negative_float(value: str) -> float:
    x = _float(value)
    if not (x >= 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number >= 0")
    return x


def shrink_budget(value: str) -> float | None:
    """A share of a property's examples (a number >= 0), or ``none`` (Hypothesis's limits)."""
    if value.strip().lower() == "none":
        return None
    x = _float(value)
    if not (x >= 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"{value!r} is not a number >= 0 or 'none'")
    return x


def fraction(value: str) -> float:
    x = _float(value)
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number from 0 to 1")
    return x


def engine_spec(value: str) -> str:
    if not ENGINE_SPEC.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not MODULE:ATTR (for example mypackage.engine:build_engine)"
        )
    return value


def model_dir(value: str, base: Path | None = None) -> str:
    """A fixture model's name or a model directory (relative to ``base``, default the working
    directory), as an absolute path."""
    try:
        return str(resolve_model(value, base))
    except EngineError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def database_spec(value: str) -> str:
    """``none``, ``redis://HOST:PORT[/DB]`` or a directory path."""
    v = value.strip()
    if not v:
        raise argparse.ArgumentTypeError("'' is not 'none', a directory or a redis:// URL")
    if v.lower() in ("none", "off"):
        return "none"
    if "://" in v and not v.startswith(("redis://", "rediss://", "unix://")):
        raise argparse.ArgumentTypeError(
            f"{value!r}: only redis://, rediss:// and unix:// URLs are supported, or a directory"
        )
    return v


def server_cmd(value: str) -> str:
    if "{port}" not in value:
        raise argparse.ArgumentTypeError(
            f"{value!r} has no {{port}} placeholder (for example "
            "'python -m mlx_lm.server --model DIR --host 127.0.0.1 --port {port}')"
        )
    return value


def server_body(value: str) -> str:
    try:
        body = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise argparse.ArgumentTypeError(
            f'{value!r} is not a JSON object (for example \'{{"cache_salt": "x"}}\')'
        )
    return value
