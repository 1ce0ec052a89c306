"""Command-line options of pytest-prefixcache (``pytest --help``, group "prefixcache"), from
:mod:`.option_table`, and its ini keys."""

from __future__ import annotations

import pytest

from . import option_table

__all__ = ["pytest_addoption"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("prefixcache", "prefix-cache verification (pytest-prefixcache)")
    option_table.add_to_pytest(group.addoption)
    parser.addini("prefixcache_engine", "Engine under test as MODULE:ATTR", default=None)
    parser.addini(
        "prefixcache_model",
        "Model every engine factory loads: a fixture name or a directory (relative to the "
        "ini file)",
        default=None,
    )
