"""The memory-budget check over ``cache_usage()``."""

from __future__ import annotations

import pytest

from pytest_prefixcache.checks.memory import usage_problems


def test_honest_usage_passes() -> None:
    assert usage_problems({"resident_bytes": 0, "entries": 0, "max_bytes": 100}) == []
    assert usage_problems({"resident_bytes": 100, "entries": 3, "max_bytes": 100}) == []
    assert usage_problems({"resident_bytes": 5, "entries": 1}) == []  # no budget reported


def test_over_budget_fails() -> None:
    [p] = usage_problems({"resident_bytes": 101, "entries": 3, "max_bytes": 100})
    assert p.check == "memory budget"
    assert p.headline == "the cache holds 101 bytes, above its budget of 100 bytes"


def test_entries_counted_as_zero_bytes_fail() -> None:
    [p] = usage_problems({"resident_bytes": 0, "entries": 7, "max_bytes": 100})
    assert p.check == "memory budget" and "7 stored cache entries are counted as 0 bytes" in (
        p.headline
    )


@pytest.mark.parametrize(
    "usage, message",
    [
        ([1, 2], "returned a list, not a mapping"),
        ({"entries": 1}, "'resident_bytes'] is None"),
        ({"resident_bytes": -1, "entries": 0}, "'resident_bytes'] is -1"),
        ({"resident_bytes": 1, "entries": True}, "'entries'] is True"),
        ({"resident_bytes": 1, "entries": 1, "max_bytes": 2.5}, "'max_bytes'] is 2.5"),
    ],
)
def test_malformed_usage_is_a_fault(usage: object, message: str) -> None:
    [p] = usage_problems(usage)
    assert p.check == "fault" and message in p.headline


def test_reference_engine_reports_its_pool() -> None:
    pytest.importorskip("mlx.core")
    from reference_engine import Engine, default_model_path

    engine = Engine.from_pretrained(default_model_path(), max_bytes=12345)
    assert engine.cache_usage() == {"resident_bytes": 0, "entries": 0, "max_bytes": 12345}
