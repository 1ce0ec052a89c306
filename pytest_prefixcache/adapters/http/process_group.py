"""What is left of a stopped server's session: a server is started as the leader of a process
group of its own (``start_new_session``, or the fork server's ``setsid``), so the group's id is
its PID, and children it spawned and did not stop are still in that group after it exits."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

__all__ = ["group_alive", "stop_group"]


def stop_group(pid: int) -> None:
    """Stop what is left of the session the server was started in (its process group, whose
    id is the server's PID): children a server spawned and did not stop when it exited, such as
    vLLM's EngineCore after its API server was killed (seen orphaned, running on). SIGTERM,
    then SIGKILL after 5 s; nothing is sent when no live process is left in the group."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        if not group_alive(pid):
            return
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and group_alive(pid):
            time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` runs: read in /proc, where zombies (exited, not yet
    reaped by whoever adopted them) do not count; without /proc, whether the group exists."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone while read
        if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            return True
    return False
