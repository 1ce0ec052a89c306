"""End to end: the plugin's built-in suite drives an HTTP adapter named by MODULE:ATTR, and
catches a server that corrupts one cached result."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("mlx_vlm")

pytest_plugins = ["pytester"]
HERE = Path(__file__).resolve().parent

FACTORY = f"""
from pytest_prefixcache.adapters.http.openai import OpenAIEngine

def corrupt_once():
    bad = "{{python}} {HERE / "corrupt_reference_server.py"} --port {{port}}"
    good = "{{python}} -m reference_engine.server --host 127.0.0.1 --port {{port}}"
    return OpenAIEngine(bad, cold="reset", cold_cmd=good, top_logprobs=20, extensions=True,
                        namespace_header="x-prefixcache-namespace")
"""


def run(pytester: pytest.Pytester, engine: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(factories=FACTORY)
    return pytester.runpytest_subprocess(
        *args,
        "-p",
        "no:randomly",
        "--prefixcache-verify",
        f"--prefixcache-engine={engine}",
        "--prefixcache-examples=2",
        "--prefixcache-seed=1",
        "-k",
        "omlx_image_edit",
        timeout=600,
    )


@pytest.mark.slow
def test_the_suite_passes_on_the_reference_server(pytester: pytest.Pytester) -> None:
    """Every check runs through the preset (it asks for the server's extension: token ids,
    spans, merges), the cold baseline too: the audit starts fresh servers."""
    engine = "pytest_prefixcache.adapters.presets:reference_server"
    result = run(pytester, engine)
    result.stdout.fnmatch_lines(
        [
            "worst |cached - uncached|: 0",
            "failures by check: none",
            "verdict: PASS",
        ]
    )
    row = r"cold baseline +(\d+)/(\d+)(?: \(not in the audit's sample: (\d+)\))?$"
    audited = re.search(row, result.stdout.str(), re.M)
    assert audited and audited[1] != "0", audited
    # every request was audited or left out of the sample, none for want of a fresh server
    assert int(audited[1]) + int(audited[3] or 0) == int(audited[2]), audited
    assert result.ret == 0


@pytest.mark.slow
def test_the_suite_catches_a_server_that_corrupts_one_hit(pytester: pytest.Pytester) -> None:
    result = run(pytester, "factories:corrupt_once")
    result.stdout.fnmatch_lines(["*failures by check: equivalence*"])
    assert result.ret == 1
