"""Helpers for the plugin's pytester tests: copy the fake engines in and run the suite."""

from __future__ import annotations

from pathlib import Path

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
