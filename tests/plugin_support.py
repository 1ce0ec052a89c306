"""Helpers for the plugin's pytester tests: copy the fake engines in and run the suite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ENGINES_SOURCE = (Path(__file__).with_name("plugin_engines.py")).read_text(encoding="utf-8")


def with_fakes(pytester: pytest.Pytester) -> pytest.Pytester:
    """Write the fake engines as ``fakeengines.py`` into the pytester directory."""
    pytester.makepyfile(fakeengines=ENGINES_SOURCE)
    return pytester


def run_suite(
    pytester: pytest.Pytester,
    engine: str,
    *args: str,
    examples: int = 5,
    subprocess: bool = False,
    timeout: float | None = None,
) -> pytest.RunResult:
    """Run ``--prefixcache-verify`` on ``fakeengines:<engine>`` with a fixed seed; ``timeout``
    (a subprocess run only) guards against a run that hangs: it fails instead."""
    argv = [
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "--prefixcache-verify",
        f"--prefixcache-engine=fakeengines:{engine}",
        f"--prefixcache-examples={examples}",
        "--prefixcache-seed=1",
        *args,
    ]
    if subprocess:
        return pytester.runpytest_subprocess(*argv, timeout=timeout)
    return pytester.runpytest(*argv)


#: The replay line a failure prints (fnmatch): this interpreter's ``prefixcache replay`` with
#: the run file written beside the saved stream.
REPLAY_LINE = (
    "* -m pytest_prefixcache.cli replay --run=.prefixcache/failures/run-*.json "
    ".prefixcache/failures/*/stream.json"
)


def run_file(directory: Path) -> dict[str, Any]:
    """The one run file under ``directory``'s ``.prefixcache/failures`` (its JSON)."""
    found = sorted((directory / ".prefixcache" / "failures").glob("run-*.json"))
    assert len(found) == 1, found
    data: dict[str, Any] = json.loads(found[0].read_text(encoding="utf-8"))
    return data
