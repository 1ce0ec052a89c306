"""--prefixcache-server-cmd: verify an OpenAI-compatible server started from a command line."""

from __future__ import annotations

import argparse
import sys

import pytest

from pytest_prefixcache.session import settings

pytest_plugins = ["pytester"]


def test_command_without_port_placeholder_is_named() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"'serve --port 80' has no \{port\}"):
        settings.server_cmd("serve --port 80")


def test_bad_command_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--prefixcache-verify", "--prefixcache-server-cmd=serve")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'serve' has no {port} placeholder*"])


def test_server_cmd_and_engine_conflict(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        "--prefixcache-verify",
        "--prefixcache-engine=a:b",
        "--prefixcache-server-cmd=serve --port {port}",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--prefixcache-server-cmd and --prefixcache-engine both*"])


@pytest.mark.slow
def test_server_cmd_verifies_the_reference_server(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: the server starts on 127.0.0.1, the suite passes through it, and the
    header names the engine."""
    pytest.importorskip("mlx.core")
    monkeypatch.setenv("PREFIXCACHE_COLD", "reset")
    monkeypatch.setenv("PREFIXCACHE_NAMESPACE_HEADER", "x-prefixcache-namespace")
    monkeypatch.delenv("PREFIXCACHE_SERVER_CMD", raising=False)
    cmd = f"{sys.executable} -m reference_engine.server --host 127.0.0.1 --port {{port}}"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--prefixcache-verify",
        f"--prefixcache-server-cmd={cmd}",
        "--prefixcache-examples=3",
        "--prefixcache-seed=1",
        "--prefixcache-timeout=120",
        "--prefixcache-allow-partial",
        "-k",
        "request_streams",
    )
    # from the environment alone the adapter has no renderer: no token_ids, no merges
    result.stdout.fnmatch_lines(
        [
            "*engine pytest_prefixcache.adapters.presets:from_env (--prefixcache-server-cmd)*",
            "requests run: [1-9]*",
            "*failures by check: none*",
            "  reuse bound * 0/* (no token_ids: *)",
            "verdict: PASS (partial: not checked on every request: *reuse bound*)",
        ]
    )
    assert result.ret == 0
