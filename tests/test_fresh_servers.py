"""The baseline audit's fresh servers (adapters/http/fresh.py, adapters/http/forkserver.py):
each one started for one audited request, sent nothing before, never reused; forked servers get
their own environment and find nothing an earlier one left.

The servers are ``tests/fresh_probe/fresh_probe_server.py`` (stdlib only), which answers how
many requests it served before and what it found in a cache directory computed at import time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_prefixcache.adapters.http.forkserver import ForkServer, fork_module
from pytest_prefixcache.adapters.http.fresh import Forks, FreshServers
from pytest_prefixcache.adapters.http.server import ServerProcess, http_json, isolated_env
from pytest_prefixcache.errors import EngineError

PROBE_DIR = Path(__file__).parent / "fresh_probe"
#: The probe's directory, then this process's own path (the fork server imports this checkout)
ENV = {"PYTHONPATH": os.pathsep.join([str(PROBE_DIR), *sys.path[1:]])}
CMD = "{python} -m fresh_probe_server --port {port}"


@pytest.fixture
def forks() -> Iterator[Forks]:
    forks = Forks(env=ENV, start_timeout=30)
    yield forks
    forks.close()


@pytest.fixture
def fresh(forks: Forks) -> Iterator[FreshServers]:
    forker = forks.get(CMD)
    assert forker is not None
    servers = FreshServers(
        lambda: ServerProcess(CMD, env=ENV, forker=forker, start_timeout=30).start(), ahead=True
    )
    yield servers
    servers.close()


def _probe(server: ServerProcess, path: str = "/probe") -> dict[str, object]:
    status, reply = http_json("POST", server.url + path, {}, timeout=10)
    assert status == 200, reply
    assert isinstance(reply, dict)
    return reply


def _audit_three(take: Callable[[], ServerProcess]) -> list[dict[str, object]]:
    """Three audited requests as the audit makes them: take a server, one request, stop it.
    Every server must be new (its own pid, its own HOME) and have served nothing before."""
    seen: list[dict[str, object]] = []
    for _ in range(3):
        server = take()
        reply = _probe(server)
        assert reply["served_before"] == 0, f"a fresh server had served before: {reply}"
        assert reply["home"] == server.home == reply["cwd"]
        assert reply["pid"] not in [r["pid"] for r in seen]
        seen.append(reply)
        server.stop()
    return seen


def test_forked_fresh_servers_are_new_and_never_reused(forks: Forks, fresh: FreshServers) -> None:
    replies = _audit_three(fresh.take)
    forker = forks.get(CMD)
    assert forker is not None and forker.proc.pid not in [r["pid"] for r in replies]
    # the next one is already started, and has served nothing either
    ahead = fresh._ahead
    assert ahead is not None
    assert _probe(ahead.result())["served_before"] == 0
    root = forker.root
    fresh.close()
    forks.close()
    assert not os.path.exists(root)


def test_a_reused_fresh_server_fails_the_check(fresh: FreshServers) -> None:
    """Negative control: a pool that hands the same server out again (and never stops it)."""
    server = fresh.take()
    server.stop = lambda: None  # type: ignore[method-assign]
    with pytest.raises(AssertionError, match="had served before"):
        _audit_three(lambda: server)
    ServerProcess.stop(server)


def test_a_server_that_wrote_to_the_fork_servers_home_stops_the_forks(
    fresh: FreshServers,
) -> None:
    first = fresh.take()
    assert _probe(first, "/persist")["cache_entries"] == 1  # written under the fork's HOME
    first.stop()
    with pytest.raises(EngineError, match="wrote to the fork server's HOME"):
        # the server started ahead was forked before the write; the next fork is refused
        fresh.take()
        fresh.take()


def test_without_the_guard_the_next_fork_finds_the_file(
    fresh: FreshServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control for the guard: what the refused fork would have seen."""
    monkeypatch.setattr(ForkServer, "_written", lambda self: [])
    _probe(fresh.take(), "/persist")
    fresh.take()  # started ahead before the write
    assert _probe(fresh.take())["cache_entries"] == 1


def test_an_exit_code_reaches_the_adapter() -> None:
    cmd = "{python} -m fresh_probe_server --port {port} --exit 3"
    forker = ForkServer("fresh_probe_server", isolated_env("{home}", ENV), start_timeout=30)
    try:
        with pytest.raises(EngineError, match="exited with 3 before it was ready"):
            ServerProcess(cmd, env=ENV, forker=forker, start_timeout=30).start()
    finally:
        forker.close()


def test_this_interpreter_under_another_name_is_forked(tmp_path: Path) -> None:
    """``python`` for ``python3`` in one environment is this interpreter; the same program
    in another directory (another environment) is not."""
    bindir = Path(sys.executable).parent
    names = [p.name for p in bindir.iterdir() if p.name.startswith("python")]
    same = [n for n in names if os.path.samefile(bindir / n, sys.executable)]
    assert [fork_module([str(bindir / n), "-m", "x"]) for n in same] == ["x"] * len(same)
    (tmp_path / "python").symlink_to(sys.executable)
    assert fork_module([str(tmp_path / "python"), "-m", "x"]) is None


def test_other_commands_start_a_process_when_asked() -> None:
    script = str(PROBE_DIR / "fresh_probe_server.py")
    cmd = [sys.executable, script, "--port", "{port}"]
    assert fork_module(cmd) is None and fork_module(["{python}", "-m", "x"]) == "x"
    assert fork_module([sys.executable, "-m", "x"]) == "x"
    assert fork_module(["/no/such/python", "-m", "x"]) is None
    assert Forks().get(cmd) is None and Forks(fork=False).get(CMD) is None
    servers = FreshServers(lambda: ServerProcess(cmd, env=ENV).start(), ahead=False)
    try:
        _audit_three(servers.take)
        assert servers._ahead is None
    finally:
        servers.close()
