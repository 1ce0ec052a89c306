"""Scenario expectations that a stream file can declare beyond the generic checks.

A corpus scenario may say that two requests must render to the same prompt
(``"expect_same_prompt": [[i, j], ...]``), e.g. because they differ only in a volatile
header line an engine must normalise away, or that request j's prompt must keep all of
request i's but its generation prompt (``"expect_extends": [[i, j], ...]``). Both are
checked on ``token_ids``; an engine that does not report them must at least reuse something
for request j.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..types import Outcome
from .oracle import Match
from .problem import Problem
from .protocol import RENDER_SLACK

__all__ = ["expectation_problems"]

WHY = (
    "the requests differ only in bytes that carry no meaning (a volatile header line); "
    "normalise them away or nothing after them is ever reused",
)


def expectation_problems(
    outcomes: Sequence[tuple[Outcome, Match | None]],
    pairs: Sequence[Sequence[int]],
    *,
    extends: bool = False,
) -> Iterator[tuple[int, Problem, dict[str, object]]]:
    """(j, problem, meta) for every pair (i, j) whose cached runs break the expectation."""
    key = "expect_extends" if extends else "expect_same_prompt"
    for i, j in pairs:
        meta: dict[str, object] = {key: [[i, j]]}
        before, after = outcomes[i][0], outcomes[j][0]
        if before.token_ids is None or after.token_ids is None:
            if after.cached_tokens == 0:
                head = f"request {j} should reuse request {i}'s prompt but reused 0 tokens"
                yield j, Problem("render stability", head, WHY), meta
            continue
        a, b = tuple(before.token_ids), tuple(after.token_ids)
        need = len(a) - (RENDER_SLACK if extends else 0)
        same = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if same < need or (not extends and len(a) != len(b)):
            what = "extend" if extends else "equal"
            head = (
                f"request {j}'s prompt should {what} request {i}'s ({len(a)} tokens) but "
                f"shares only its first {same} tokens (now {len(b)} tokens)"
            )
            yield j, Problem("render stability", head, WHY, position=same), meta
