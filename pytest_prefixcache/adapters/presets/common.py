"""What the presets share: the tap launcher and a matrix combination's flags on a command."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ..flags import split_flags

__all__ = ["TAP", "quoted_flags"]

#: The launcher prefix that runs a server's CLI function under the logit tap.
TAP = "{python} -m pytest_prefixcache.tap"


def quoted_flags(flags: Sequence[str]) -> str:
    """``flags`` (each a command-line string: a matrix alternative may carry a flag and its
    value) as words appended to a command, each quoted, with a leading space."""
    return "".join(f" {shlex.quote(w)}" for w in split_flags(flags))
