"""The memory-budget check, for engines that report their cache's memory use.

An engine may offer an optional method ``cache_usage() -> Mapping[str, int]`` with
``resident_bytes`` (bytes its prefix cache holds now), ``entries`` (stored blocks or entries)
and, if it has one, ``max_bytes`` (its budget). After every cached run the verifier asks for it
and checks two invariants: resident bytes never exceed the budget, and stored entries are never
counted as 0 bytes (the accounting bug behind ml-explore/mlx-vlm #1901 and vllm-mlx #541: an
entry counted as 0 bytes means the budget is never enforced).
"""

from __future__ import annotations

from collections.abc import Mapping

from .problem import Problem

__all__ = ["usage_problems"]

CHECK = "memory budget"


def usage_problems(usage: object) -> list[Problem]:
    """Problems with what ``cache_usage()`` returned."""
    if not isinstance(usage, Mapping):
        return [Problem("fault", f"cache_usage() returned a {type(usage).__name__}, not a mapping")]
    values: dict[str, int] = {}
    for key in ("resident_bytes", "entries", "max_bytes"):
        value = usage.get(key)
        if value is None and key == "max_bytes":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return [Problem("fault", f"cache_usage()[{key!r}] is {value!r}, not an int >= 0")]
        values[key] = value
    resident, entries = values["resident_bytes"], values["entries"]
    budget = values.get("max_bytes")
    if budget is not None and resident > budget:
        return [
            Problem(
                CHECK,
                f"the cache holds {resident} bytes, above its budget of {budget} bytes",
                (f"entries stored: {entries}",),
            )
        ]
    if entries > 0 and resident == 0:
        return [
            Problem(
                CHECK,
                f"{entries} stored cache entries are counted as 0 bytes: the budget is never "
                "enforced",
                (f"budget: {budget} bytes" if budget is not None else "no budget reported",),
            )
        ]
    return []
