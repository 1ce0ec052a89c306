"""Where the files that ship with the package are: the scenario corpus and the tiny models.

A source checkout keeps them in the repository's ``fixtures/``; a wheel (or an install from the
sdist) carries the same directory as ``pytest_prefixcache/fixtures/`` (pyproject.toml maps one
onto the other). Either way they are found from any working directory, nothing is built or
downloaded at run time, and nothing is written outside them.
"""

from __future__ import annotations

from pathlib import Path

from .errors import PrefixCacheError

__all__ = ["CORPUS", "FIXTURES", "fixture_model"]

_INSTALLED = Path(__file__).resolve().parent / "fixtures"
_CHECKOUT = Path(__file__).resolve().parent.parent / "fixtures"

#: The installed copy when there is one (a wheel), else the source checkout's ``fixtures/``.
FIXTURES: Path = _INSTALLED if _INSTALLED.is_dir() else _CHECKOUT
#: The built-in scenario corpus (``*.json`` request streams, one directory level).
CORPUS: Path = FIXTURES / "corpus"


def fixture_model(name: str) -> Path:
    """The shipped tiny model directory ``name`` (``tiny-qwen2-vl``, ``tiny-llama``,
    ``tiny-qwen3.5-vl``, ``tiny-qwen3.5``, ``tiny-gemma3``, ``tiny-gemma3-text``); raise
    PrefixCacheError naming the path when it is missing (a broken install or checkout)."""
    path = FIXTURES / name
    if not (path / "config.json").is_file():
        raise PrefixCacheError(
            f"the fixture model {name!r} is missing: {str(path)!r} has no config.json "
            f"(rebuild it offline with: python -m reference_engine.fixtures --out {FIXTURES})"
        )
    return path
