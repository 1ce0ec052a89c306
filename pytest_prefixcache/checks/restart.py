"""Restarts: what an engine may restore after one (``--prefixcache-restarts``).

A restart with the same configuration may restore anything it cached before, by the rules of
any hit (the same bound, the same equivalence against a cold run). A restart with one thing
changed (the weights, the tokenizer or chat template, the KV dtype; an adapter) starts a new
identity: nothing cached before it may be reused, whether or not the restored rows happen to
give the same logits (SGLang #33268 served KV of another dtype from disk; #39830 restored 10
of 10 requests from disk, 0 of 10 byte-identical). The verifier forgets the stream's tokens
at such a restart, so the bound counts only what was computed since; reusing more is a
``stale identity`` problem, judged before the bound and the equivalence.
"""

from __future__ import annotations

from ..types import Outcome
from .oracle import Match
from .problem import Problem

__all__ = ["NOT_DECLARED", "RESTART", "STALE", "stale_problems"]

#: The coverage row of restarts: one count per restart asked for.
RESTART = "restart"
#: The coverage row (and check) of reuse across a changed identity: one count per request
#: served after a restart with something changed.
STALE = "stale identity"
#: Why a restart could not run: the engine declares no ``restart(changed)``.
NOT_DECLARED = "no restart() declared"


def stale_problems(cached: Outcome, match: Match | None, changed: str | None) -> list[Problem]:
    """After a restart with ``changed`` changed, ``cached_tokens`` may not exceed what the
    requests since it allow (``match``: the oracle reset at the restart)."""
    if changed is None or cached.cached_tokens is None:
        return []
    allowed = 0 if match is None else match.limit
    if cached.cached_tokens <= allowed:
        return []
    return [
        Problem(
            STALE,
            f"cached_tokens={cached.cached_tokens} after a restart with the {changed} changed: "
            f"at most {allowed} tokens computed since the restart may be reused",
            (
                f"the engine restarted with another {changed}; every prefix cached before the "
                "restart belongs to the old identity and must not be reused",
                "a disk or host tier keyed without that identity field serves stale KV "
                "(SGLang #33268: the KV dtype; #26747: the salt)",
            ),
            position=allowed,
        )
    ]
