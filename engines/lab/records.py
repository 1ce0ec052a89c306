"""What the lab's opt-in engine tests record besides pass or fail: measurements appended to a
findings file, and the per-step logprob difference of two outcomes."""

from __future__ import annotations

import json
import math
import os

from pytest_prefixcache import Outcome

__all__ = ["record_finding", "step_diff"]


def record_finding(env: str, engine: str, mode: str, **fields: object) -> None:
    """Append one measurement to the JSON-lines file named by the environment variable
    ``env`` (the engine scripts' ``*_FINDINGS``), if it is set."""
    path = os.environ.get(env)
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
        with open(path, "a") as f:
            f.write(json.dumps({"engine": engine, "mode": mode, "test": test, **fields}) + "\n")


def step_diff(cached: Outcome, cold: Outcome) -> float:
    """max |cached - cold| over every decode step's logprobs (inf when the greedy tokens, the
    number of steps or the token ids a step reports differ)."""
    a, b = cached.step_top_logprobs, cold.step_top_logprobs
    if cached.tokens != cold.tokens or len(a) != len(b) or not a:
        return math.inf
    if any(set(x) != set(y) for x, y in zip(a, b)):
        return math.inf
    return max(abs(x[t] - y[t]) for x, y in zip(a, b) for t in x)
