"""Isolation across identities: requests in another namespace (a tenant, a cache salt) or with
another adapter share nothing (vLLM #44250: a KV key without the LoRA identity; SGLang #37160
and #23300: the salt ignored on one path).

The correctness of such a request is judged as any other's: the reuse bound counts only the
prompts of its own scope (``Request.scope``), and the equivalence compares it with its own
identity's cold run. This module adds the coverage row ``isolation`` (one count per request
that another scope's earlier prompt shares more tokens with than its own scope allows: the
requests where a cache keyed without the identity would have reused something) and the
headline problem when it did (``cached_tokens`` beyond its own scope's bound and within the
other scope's).
"""

from __future__ import annotations

from ..types import Outcome
from .oracle import Match
from .problem import Problem

__all__ = ["ISOLATION", "NO_CROSSING", "describe_scope", "isolation_problems", "isolation_row"]

#: The coverage row (and check) of isolation across namespaces, salts and adapters.
ISOLATION = "isolation"
#: Why the row did not apply: no earlier prompt of another identity shared more of it.
NO_CROSSING = "no other identity shared more of its prompt"


def describe_scope(scope: str) -> str:
    """``Request.scope`` in words: ``namespace '' with adapter 'lora'``."""
    namespace, _, adapter = scope.partition("\0adapter=")
    return f"namespace {namespace!r}" + (f" with adapter {adapter!r}" if adapter else "")


def isolation_row(match: Match | None, crossing: tuple[int, str | None]) -> str:
    """The row's outcome for one request: applied when another scope shared more."""
    own = 0 if match is None else match.limit
    return "applied" if crossing[0] > own else NO_CROSSING


def isolation_problems(
    cached: Outcome, match: Match | None, crossing: tuple[int, str | None], scope: str
) -> list[Problem]:
    """A problem when ``cached_tokens`` exceeds the own scope's bound but not what the other
    scope's prompt shares: the cache served another identity's prefix."""
    reused, (shared, other) = cached.cached_tokens, crossing
    own = 0 if match is None else match.limit
    if reused is None or other is None or reused <= own or reused > shared:
        return []
    return [
        Problem(
            ISOLATION,
            f"cached_tokens={reused} in {describe_scope(scope)}: its own identity allows at "
            f"most {own}, but {describe_scope(other)} sent a prompt sharing {shared} tokens",
            (
                "requests of different namespaces (tenants, cache salts) or adapters must not "
                "share cache entries; the keys must chain from the whole identity",
                "vLLM #44250 (an external KV key without the LoRA id), SGLang #37160 and "
                "#23300 (the cache salt dropped on one path)",
            ),
            position=own,
        )
    ]
