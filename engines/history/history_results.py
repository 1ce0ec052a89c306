"""What one side of a public-record run found, read from its report (``suite.json``), its log and
its exit code: the verdict, the failing check, the shrunk stream's size, and the seconds and
examples to the first failure (the report's own stamp, or an older run's progress line)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "PROGRESS",
    "UNCHECKABLE",
    "first_failure",
    "first_failure_seconds",
    "parse",
    "partial_pass",
    "stamped",
    "stream_size",
]

PROGRESS = re.compile(
    r"prefixcache: (\d+) requests \(\d+ with cache hits\) in (\d+) streams[^,]*, (\d+) failed "
    r"test\(s\)(?:, shrinking: (\d+) failing example\(s\) so far)?; (?:(\d+)m)?(\d+)s"
)


#: What a layered run cannot check and still passes without: the cold baseline's audit, which
#: the seed and vLLM runners switch off (``--prefixcache-allow-partial``: a fresh server per
#: audited request, as engines/seed and engines/vllm run them), and the shapes of batch merges,
#: which only the logit tap sees (torch engines have none). A partial verdict whose every
#: unchecked row is one of these, with no failure, is a pass (:func:`partial_pass`).
UNCHECKABLE = ("cold baseline", "shapes")


def partial_pass(not_checked: Iterable[str]) -> str:
    """The verdict of a partial run that left only ``not_checked`` (rows of UNCHECKABLE)."""
    return f"PASS (partial: not checked: {', '.join(sorted(not_checked))})"


def first_failure(log: str) -> tuple[int, int, int] | None:
    """(seconds, streams, requests) of the first progress line that counts a failing example
    or a failed test: the clock, and the examples (streams) and requests run by then."""
    for m in PROGRESS.finditer(log):
        if int(m.group(3)) or int(m.group(4) or 0):
            return int(m.group(5) or 0) * 60 + int(m.group(6)), int(m.group(2)), int(m.group(1))
    return None


def first_failure_seconds(log: str) -> int | None:
    """The clock of :func:`first_failure`, or None."""
    first = first_failure(log)
    return first[0] if first else None


def stamped(suite: dict[str, Any], log: str) -> tuple[float | None, int | None]:
    """(seconds, examples) to the first failure: the report's own stamp (``first_failure``,
    the moment any failure happened, a timeout's as it fired), else, in a report written
    before the plugin stamped it, the first progress line that counts one (:func:`first_failure`;
    None when the failure ended the run before a line did)."""
    first = suite.get("first_failure")
    if isinstance(first, dict) and first.get("seconds") is not None:
        return float(first["seconds"]), first.get("streams")
    line = first_failure(log)
    return (float(line[0]), line[1]) if line else (None, None)


def stream_size(stream_dir: str | None) -> int | None:
    """Requests in a saved (shrunk) stream, or None without one."""
    path = Path(stream_dir or "") / "stream.json"
    if not stream_dir or not path.is_file():
        return None
    data = json.loads(path.read_text())
    requests = data.get("requests")
    if isinstance(requests, list):
        return len(requests)
    waves = data.get("waves")
    return sum(len(w) for w in waves) if isinstance(waves, list) else None


def parse(
    suite: dict[str, Any] | None,
    log: str,
    returncode: int,
    uncheckable: Iterable[str] = UNCHECKABLE,
) -> dict[str, Any]:
    """One side's outcome from its report (None: none was written), log and exit code;
    ``uncheckable``: the rows a partial pass may leave (history_llama.UNCHECKABLE for llama)."""
    if not suite:
        tail = [x for x in log.strip().splitlines() if x.strip()][-3:]
        return {"verdict": "ERROR", "check": None, "example": " | ".join(tail)[:400]}
    failures = suite.get("failures") or []
    first = failures[0] if failures else {}
    verdict = str(suite.get("verdict") or ("FAIL" if returncode else "PASS")).upper()
    if failures and not verdict.startswith("FAIL"):
        verdict = "FAIL"
    gaps = set(suite.get("not_checked") or {})
    if verdict == "PARTIAL" and not failures and gaps <= set(uncheckable):
        verdict = partial_pass(gaps)
    return {
        "verdict": verdict,
        "check": first.get("check"),
        "example": first.get("summary"),
        "test": first.get("test"),
        "shrunk_requests": stream_size(first.get("stream_dir")),
        "seconds_to_failure": stamped(suite, log)[0] if failures else None,
        "examples_to_failure": stamped(suite, log)[1] if failures else None,
        "timed_by": ("stamp" if suite.get("first_failure") else "progress line")
        if failures
        else None,
        "slowest_call": suite.get("slowest_call"),  # what a correct side's timeout needs
        "requests": suite.get("requests"),
        "cache_hits": suite.get("cache_hits"),
        "failures_by_check": suite.get("failures_by_check") or {},
        "engine_error": suite.get("engine_error"),
        "not_checked": sorted(suite.get("not_checked") or {}),  # a PARTIAL verdict's gaps
    }
