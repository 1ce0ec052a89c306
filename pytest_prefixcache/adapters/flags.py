"""Reading a server's command-line flags: the one home of ``split_flags`` and ``flag_value``.

The engine presets (llama-server, vLLM, oMLX, the seed engines) take their flags as a list of
strings in which a matrix alternative may carry a flag and its value (``"--block-size 64"``);
they read a few values back to derive what the server will do (its slots, its block size, its
KV types).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

__all__ = ["flag_value", "split_flags"]


def split_flags(flags: Sequence[str]) -> list[str]:
    """``flags`` as argv words (a matrix alternative may carry a flag and its value)."""
    return [word for flag in flags for word in shlex.split(flag)]


def flag_value(words: Sequence[str], names: str | Sequence[str]) -> str | None:
    """The value of the last ``NAME V`` or ``NAME=V`` among ``words`` (argv words, as
    :func:`split_flags` gives them) for ``names`` (one name or its spellings); None when not
    given, "" for a trailing ``NAME`` with no value."""
    wanted = (names,) if isinstance(names, str) else tuple(names)
    value = None
    for i, word in enumerate(words):
        name, eq, rest = word.partition("=")
        if name in wanted:
            value = rest if eq else (words[i + 1] if i + 1 < len(words) else "")
    return value
