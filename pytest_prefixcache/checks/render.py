"""The render checks: a prompt a cache could reuse must render to the same tokens.

Render stability: an identical request must render to the same token ids, and an append-only
next turn must keep the earlier prompt but its generation prompt (the last ``RENDER_SLACK``
tokens); else no prefix cache can reuse it (volatile header bytes, history re-rendered,
tokenisation that is not compositional at the seam).

Scenario expectations that a stream file can declare beyond that: a corpus scenario may say
that two requests must render to the same prompt (``"expect_same_prompt": [[i, j], ...]``),
e.g. because they differ only in a volatile header line an engine must normalise away, or
that request j's prompt must keep all of request i's but its generation prompt
(``"expect_extends": [[i, j], ...]``). Both are checked on ``token_ids``; an engine that does
not report them must at least reuse something for request j.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..types import Outcome, Request
from .oracle import Match, shared_prefix
from .problem import Problem

__all__ = [
    "HYGIENE",
    "RENDER_SLACK",
    "Rendered",
    "expectation_problems",
    "kept_prefix",
    "render_problems",
]

#: The efficiency-tier render check: a next turn that re-renders the history, or requests
#: that differ only in volatile bytes. Reported everywhere; fails only when asked
#: (``--prefixcache-strict-render``). An identical request that renders differently is
#: "render stability", a correctness failure.
HYGIENE = "render hygiene"

#: An append-only next turn must keep all of the previous prompt but its last RENDER_SLACK
#: tokens (the generation prompt, e.g. ``<|im_start|>assistant\n``).
RENDER_SLACK = 8
Rendered = tuple[int, Request, tuple[int, ...]]
"""(stream index, request, its prompt's token_ids) of an earlier request."""


def kept_prefix(before: Sequence[int], after: Sequence[int], *, extends: bool) -> int | None:
    """None when ``after`` keeps ``before`` as the rule asks, else how many tokens they share.

    ``extends=False``: ``after`` is the same prompt. ``extends=True``: ``after`` is an
    append-only next turn and keeps all of ``before`` but its last ``RENDER_SLACK`` tokens.
    """
    same = shared_prefix(before, after)
    need = len(before) - (RENDER_SLACK if extends else 0)
    if same >= need and (extends or len(after) == len(before)):
        return None
    return same


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
                yield j, Problem(HYGIENE, head, WHY), meta
            continue
        a, b = tuple(before.token_ids), tuple(after.token_ids)
        same = kept_prefix(a, b, extends=extends)
        if same is not None:
            what = "extend" if extends else "equal"
            head = (
                f"request {j}'s prompt should {what} request {i}'s ({len(a)} tokens) but "
                f"shares only its first {same} tokens (now {len(b)} tokens)"
            )
            yield j, Problem(HYGIENE, head, WHY, position=same), meta


def render_problems(
    request: Request, token_ids: tuple[int, ...], earlier: list[Rendered]
) -> list[Problem]:
    """An identical request must render to the same tokens, and an append-only next turn
    must keep the earlier prompt (bar its generation prompt): else no cache can reuse it."""
    ids = tuple(token_ids)
    for index, req, before in reversed(earlier):
        if req.namespace != request.namespace:
            continue
        n = len(req.messages)
        if request.messages == req.messages:
            kind, extends = "an identical request", False
        elif len(request.messages) > n and request.messages[:n] == req.messages:
            kind, extends = "an append-only next turn", True
        else:
            continue
        same = kept_prefix(before, ids, extends=extends)
        if same is None:
            return []
        got = f"{ids[same]}" if same < len(ids) else "end"
        was = f"{before[same]}" if same < len(before) else "end"
        return [
            Problem(
                HYGIENE if extends else "render stability",
                f"{kind} of request {index} shares only the first {same} of its "
                f"{len(before)} prompt tokens (now {len(ids)} tokens)",
                (
                    f"first different token at position {same}: {got} (was {was})",
                    "the prompt is re-rendered or re-tokenised differently (volatile header, "
                    "history re-rendered, tokenisation not compositional at the seam), so no "
                    "prefix cache can reuse it",
                ),
                position=same,
            )
        ]
    return []
