"""The checks: functions from outcomes to problems.

Each check is pure (outcomes in, problems out; only the isolation audit in ``timing`` drives
an engine itself) and returns a list of :class:`Problem` (or one, or none); the verifier
(:mod:`pytest_prefixcache.verify`) runs them on every request and turns the first into a
readable failure. One module per subject: ``protocol`` (faults, a pair's agreement, merges),
``equivalence`` (cached vs uncached logits under a tolerance rule), ``oracle``, ``references``
and ``reuse`` (the most a correct cache of each design could reuse; the reuse bound, the
positive control, the efficiency floor), ``claims`` (what the engine claimed against what its
model computed), ``prompt_logprobs`` (a hit's prompt logprobs against the cold run's),
``render`` (render stability, corpus expectations), ``memory`` (the budget)
and ``timing`` (the speedup floor, the tenant-isolation audit).
"""

from __future__ import annotations

from .baseline import baseline_problems, fresh_problems, fresh_verdict
from .claims import claim_problems, claims_counts
from .coverage import coverage_of
from .equivalence import Comparison, Tolerance, compare
from .memory import usage_problems
from .oracle import Match, ReuseOracle, position_keys, shared_prefix
from .problem import Problem
from .prompt_logprobs import PROMPT_LOGPROBS, prompt_logprob_problems
from .protocol import fault_problems, merge_problems, pair_problems, span_at
from .references import REUSE_REFERENCES, CacheDesign, ReuseReference
from .render import (
    HYGIENE,
    RENDER_SLACK,
    Rendered,
    expectation_problems,
    kept_prefix,
    render_problems,
)
from .reuse import (
    CAPACITY,
    CONTROL_MIN_TOKENS,
    EFFICIENCY_MIN_TOKENS,
    NO_SNAPSHOT,
    OLDER_ENTRY,
    UNDER_ONE_BLOCK,
    control_problems,
    efficiency_problem,
    reuse_problems,
)
from .timing import FIRST_TOKEN, SPEEDUP_MIN_SECONDS, WHOLE_CALLS, speedup_problem

__all__ = [
    "CAPACITY",
    "CONTROL_MIN_TOKENS",
    "EFFICIENCY_MIN_TOKENS",
    "FIRST_TOKEN",
    "HYGIENE",
    "NO_SNAPSHOT",
    "OLDER_ENTRY",
    "PROMPT_LOGPROBS",
    "RENDER_SLACK",
    "REUSE_REFERENCES",
    "SPEEDUP_MIN_SECONDS",
    "UNDER_ONE_BLOCK",
    "WHOLE_CALLS",
    "CacheDesign",
    "Comparison",
    "Match",
    "Problem",
    "Rendered",
    "ReuseOracle",
    "ReuseReference",
    "Tolerance",
    "baseline_problems",
    "claim_problems",
    "claims_counts",
    "compare",
    "control_problems",
    "coverage_of",
    "efficiency_problem",
    "expectation_problems",
    "fault_problems",
    "fresh_problems",
    "fresh_verdict",
    "kept_prefix",
    "merge_problems",
    "pair_problems",
    "position_keys",
    "prompt_logprob_problems",
    "render_problems",
    "reuse_problems",
    "shared_prefix",
    "span_at",
    "speedup_problem",
    "usage_problems",
]
