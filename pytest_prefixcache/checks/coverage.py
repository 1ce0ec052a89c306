"""Coverage: which correctness checks could run on a request, and why the others could not.

A check needs data the engine may not return (token ids, image spans, cached_tokens, merges,
decode-step logits). A verdict that says PASS for a check that never ran is worse than none,
so the verifier counts, per check, the requests it applied to and, for every other request,
the reason; the session's verdict is PASS only when every correctness check applied to every
request it concerns (``REQUIRED``), or the user accepted partial coverage.

The cold baseline's row counts every request: those its audit did not sample are shown as
:data:`NOT_SAMPLED`, which is not a gap. The memory-budget check is counted too but not
required: it is an extra an engine offers
with ``cache_usage()``, and a server has no standard way to report its cache's memory. The
claims rows (:mod:`.claims`) are required only when the engine declares claim sources: their
:data:`UNCLAIMED` reasons (nothing declared, nothing claimed) are not gaps.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from ..types import Outcome, Request
from .claims import CLAIMS, STEPS
from .prompt_logprobs import NO_REUSED_POSITION, PROMPT_LOGPROBS, prompt_logprob_coverage

__all__ = [
    "APPLIED",
    "ATTRIBUTION",
    "ATTRIBUTION_REASONS",
    "BOTH_STOPPED",
    "DECLARED",
    "HINTS",
    "NOTHING_CLAIMED",
    "NOT_DECLARED",
    "NOT_SAMPLED",
    "NO_LOGPROBS",
    "NO_TAP",
    "REQUIRED",
    "SERVER_HINTS",
    "SPECULATION",
    "UNCLAIMED",
    "CoverageRow",
    "attribution_of",
    "claims_coverage",
    "coverage_lines",
    "coverage_of",
    "coverage_rows",
    "gap_lines",
    "missing",
    "row_lines",
]

#: The key under which a check's count of requests it applied to is kept.
APPLIED = "applied"
#: The coverage row of how each request's computed rows were tied to its reply (not a check,
#: never a gap): applied when the server's scheduler named the request (``Outcome.attribution``
#: ``"id"``), otherwise how it was inferred.
ATTRIBUTION = "tap attribution by id"
ATTRIBUTION_REASONS = {
    "sequential": "sequential (inferred, no other request ran meanwhile)",
    "guessed": "guessed (inferred among requests in flight)",
}
_STRENGTH = {"id": 0, "sequential": 1, "guessed": 2}
#: The coverage row of speculative decoding (not required): applied when the cached run
#: speculated and the cold run it is compared with did not, so that equivalence compared the
#: speculative decode with plain greedy decoding; a row only where the cached run speculated.
SPECULATION = "speculation"
SPECULATED_BOTH = "the cold run speculated too"
#: The correctness checks that must apply for a full PASS, in the order reports show them.
REQUIRED = (
    "equivalence",
    "equivalence at decode steps",
    "shapes",
    "reuse bound",
    "positive control",
    "render stability",
    "cold baseline",
)
#: Checks required only when the engine declares claim sources (see :func:`claims_coverage`).
DECLARED = (CLAIMS, STEPS)
NOT_DECLARED = "no claim sources declared"
NO_TAP = "no tap"
NOTHING_CLAIMED = "no source gave a figure"
NO_LOGPROBS = "no per-step logprobs in the reply"
#: Reasons of the claims rows that are not gaps: nothing was claimed.
UNCLAIMED = frozenset({NOT_DECLARED, NOTHING_CLAIMED, NO_LOGPROBS})
#: The equivalence row's reason for a request whose runs both stopped before their first
#: token without reporting it (``Outcome.unreported_stop``): the same greedy first token (a
#: stop token) on both sides, no logprob to compare. Shown, not a gap.
BOTH_STOPPED = "both runs stopped before their first token (stop token not reported)"
#: The cold baseline's reason for a request the audit did not sample: not a gap (the audit is
#: a sample by design), shown so that the row reads audited / all requests.
NOT_SAMPLED = "not in the audit's sample"
#: What the engine must return to enable a check that could not run, by reason.
HINTS = {
    "no token_ids": "return Outcome.token_ids (the prompt's token ids)",
    "no cached_tokens": "return Outcome.cached_tokens (prompt tokens reused from the cache)",
    "no image_spans": "return Outcome.image_spans ((start, end, digest) of each image's "
    "placeholders)",
    "no merges": "return Outcome.merges ((slots, rows) of each vision merge)",
    "no step_logits": "return Outcome.step_logits (the logits of every decode step) or "
    "step_top_logprobs",
    "step_logits on one side only": "return step_logits from both the cached and the uncached run",
    "nothing compared": "return logits (or top_logprobs that name the same token ids) on both runs",
    "no cache_usage()": "offer cache_usage() -> {resident_bytes, entries, max_bytes}",
    "engine given as an instance": "name a zero-argument callable that builds the engine "
    "(MODULE:FACTORY), so that a fresh instance can recompute uncached requests",
    "a server given by URL: no fresh server can be started": "give the server's command "
    "(OpenAIEngine(cmd), --prefixcache-server-cmd) so that fresh servers can recompute "
    "uncached requests, or accept partial coverage",
    "the audit's fresh servers are switched off (audit=False, PREFIXCACHE_AUDIT=0)": "let "
    "the adapter start a fresh server per audited request (drop PREFIXCACHE_AUDIT=0)",
    "the engine opts out (supports_fresh_instances = False)": "let the factory build a "
    "fresh instance cheaply and drop supports_fresh_instances = False",
    "no prompt_logprobs in the reply": "return Outcome.prompt_logprobs on both runs (vLLM: "
    "Readout(prompt_logprobs=K) asks for them), or drop returns_prompt_logprobs",
    NO_TAP: "run the server under the logit tap (tap=True) so that its claims can be "
    "compared with what the model computed",
    SPECULATED_BOTH: "compare with a cold run without speculation (a cold server without "
    "--draft-model; the reference engine's uncached run decodes plainly)",
    "engine from a conftest.py fixture": "name the engine's factory with "
    "--prefixcache-engine=MODULE:FACTORY instead of overriding prefixcache_engine",
}


#: What a server user can set instead (``--prefixcache-server-cmd`` and the ``PREFIXCACHE_*``
#: variables of the README), by reason: a server user cannot change what ``run()`` returns.
TAP_HINT = (
    "run the server under the logit tap (PREFIXCACHE_TAP_SERVER=1 and a command "
    "'{python} -m pytest_prefixcache.tap MODULE:FUNC ...')"
)
SERVER_HINTS = {
    "no token_ids": "set PREFIXCACHE_RENDER=text:DIR or vlm:DIR (render the prompt locally "
    "with the model directory), or PREFIXCACHE_PROMPT_IDS=reply or tokenize where the server "
    "returns them (PREFIXCACHE_EXTENSIONS=1 for the reference server)",
    "no cached_tokens": "the replies carry no usage.prompt_tokens_details.cached_tokens: "
    + TAP_HINT,
    "no image_spans": "set PREFIXCACHE_RENDER=vlm:DIR, or PREFIXCACHE_IMAGE_TOKEN_ID with "
    "PREFIXCACHE_PROMPT_IDS; a server without images: PREFIXCACHE_TEXT_ONLY=1",
    "no merges": "a server reports no vision merges (the reference server does with "
    "PREFIXCACHE_EXTENSIONS=1): PREFIXCACHE_TEXT_ONLY=1 sends no images, or "
    "--prefixcache-allow-partial accepts it",
    "no step_logits": "the replies carry no logprobs for every decode step: " + TAP_HINT,
    "step_logits on one side only": "the replies carry no logprobs for every decode step on "
    "one of the two servers: " + TAP_HINT,
    "nothing compared": "the replies carry no logprobs (ask with PREFIXCACHE_TOP_LOGPROBS), "
    "or " + TAP_HINT,
    "a server given by URL: no fresh server can be started": "give the server's command "
    "(--prefixcache-server-cmd or PREFIXCACHE_SERVER_CMD) so that fresh servers can "
    "recompute uncached requests, or accept partial coverage",
    "the audit's fresh servers are switched off (audit=False, PREFIXCACHE_AUDIT=0)": "drop "
    "PREFIXCACHE_AUDIT=0",
    NO_TAP: TAP_HINT,
}


def coverage_of(
    request: Request,
    cached: Outcome,
    uncached: Outcome,
    *,
    has_usage: bool,
    compared: int = 1,
    prompt_logprobs: bool = False,
) -> Iterator[tuple[str, str]]:
    """(check, APPLIED or the reason it could not run) for every check that concerns this
    request. A check that does not concern it (shapes on a text-only request, decode steps of
    a one-token answer) yields nothing. ``compared``: the steps the comparison compared;
    ``prompt_logprobs``: the engine declares ``returns_prompt_logprobs``."""
    stopped = cached.unreported_stop and uncached.unreported_stop
    yield "equivalence", APPLIED if compared else BOTH_STOPPED if stopped else "nothing compared"
    if max(len(cached.tokens), len(uncached.tokens)) > 1:
        c = bool(cached.step_logits or cached.step_top_logprobs)
        u = bool(uncached.step_logits or uncached.step_top_logprobs)
        reason = "no step_logits" if not (c or u) else "step_logits on one side only"
        yield "equivalence at decode steps", APPLIED if (c and u) else reason
    ids = _first_missing(cached, "token_ids", "cached_tokens")
    images = bool(request.images)
    if images:
        shape_gap = _first_missing(cached, "merges", "image_spans") or _first_missing(
            uncached, "merges", "image_spans"
        )
        yield "shapes", shape_gap or APPLIED
    spans = _first_missing(cached, "image_spans") if images else None
    yield "reuse bound", ids or spans or APPLIED
    yield "positive control", ids or APPLIED
    yield "render stability", _first_missing(cached, "token_ids") or APPLIED
    yield "memory budget", APPLIED if has_usage else "no cache_usage()"
    yield from claims_coverage(cached, uncached)
    yield from prompt_logprob_coverage(cached, uncached, declared=prompt_logprobs)
    if cached.speculated:
        yield SPECULATION, SPECULATED_BOTH if uncached.speculated else APPLIED
    how = attribution_of(cached, uncached)
    if how is not None:
        yield ATTRIBUTION, APPLIED if how == "id" else ATTRIBUTION_REASONS[how]


def attribution_of(cached: Outcome, uncached: Outcome) -> str | None:
    """How the request's rows were attributed by whatever observed the model (the logit tap):
    the weaker of its two runs' (``id``, then ``sequential``, then ``guessed``); None when
    nothing observed the model."""
    seen = [o.attribution for o in (cached, uncached) if o.attribution is not None]
    if not seen:
        return None
    return max(seen, key=lambda a: _STRENGTH.get(a, len(_STRENGTH)))


def claims_coverage(cached: Outcome, uncached: Outcome) -> Iterator[tuple[str, str]]:
    """Both claims rows: applied when what the engine claimed could be compared with what its
    model computed; otherwise why not."""
    both = [c for c in (cached.claims, uncached.claims) if c is not None]
    if not both:
        yield CLAIMS, NOT_DECLARED
        yield STEPS, NOT_DECLARED
        return
    if any(c.reused is None for c in both):
        yield CLAIMS, NO_TAP
    elif any(cl.value is not None for c in both for cl in c.reuse):
        yield CLAIMS, APPLIED
    else:
        yield CLAIMS, NOTHING_CLAIMED
    if all(c.steps is None for c in both):
        yield STEPS, NO_LOGPROBS
    elif any(c.computed_steps is None for c in both):
        yield STEPS, NO_TAP
    else:
        yield STEPS, APPLIED


def _first_missing(outcome: Outcome, *names: str) -> str | None:
    for name in names:
        if getattr(outcome, name) is None:
            return f"no {name}"
    return None


def missing(coverage: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """The required checks that could not run on some request: check -> reason -> requests.
    The claims rows count only where something was claimed; the prompt-logprobs row (shown
    only where they were returned or declared) where a run returned none."""
    out = {}
    for check in (*REQUIRED, *DECLARED, PROMPT_LOGPROBS):
        skip = UNCLAIMED if check in DECLARED else frozenset()
        if check == PROMPT_LOGPROBS:
            skip = frozenset({NO_REUSED_POSITION})
        if check == "cold baseline":
            skip = frozenset({NOT_SAMPLED})
        if check == "equivalence":
            skip = frozenset({BOTH_STOPPED})
        reasons = {
            k: v for k, v in coverage.get(check, {}).items() if k != APPLIED and k not in skip and v
        }
        if reasons:
            out[check] = reasons
    return out


@dataclass(frozen=True)
class CoverageRow:
    """One check's row of the coverage table: the requests it ran on, of those that concern
    it, and why it could not run on the others."""

    check: str
    ran: int
    total: int
    reasons: tuple[tuple[str, int], ...]
    """(reason, requests) for the requests it did not run on, in the order they were met."""
    gap: bool
    """A required check that could not run on some request: the verdict cannot be PASS."""

    @property
    def why(self) -> str:
        return ", ".join(f"{k}: {v}" for k, v in self.reasons)


def coverage_rows(coverage: Mapping[str, Mapping[str, int]]) -> list[CoverageRow]:
    """The coverage table: the required checks first, in :data:`REQUIRED` order, then the
    others by name."""
    gaps = missing(coverage)
    order = [c for c in REQUIRED if c in coverage]
    order += sorted(set(coverage) - set(order))
    return [
        CoverageRow(
            check,
            coverage[check].get(APPLIED, 0),
            sum(coverage[check].values()),
            tuple((k, v) for k, v in coverage[check].items() if k != APPLIED),
            check in gaps,
        )
        for check in order
    ]


def row_lines(rows: Sequence[CoverageRow]) -> list[str]:
    """The terminal's coverage table: a title, then one line per check."""
    width = max((len(r.check) for r in rows), default=0)
    out = [
        f"  {r.check:<{width}}  {r.ran}/{r.total}" + (f" ({r.why})" if r.why else "") for r in rows
    ]
    return ["coverage (requests each check ran on / that concern it):", *out] if out else []


def coverage_lines(coverage: Mapping[str, Mapping[str, int]]) -> list[str]:
    """One line per check: the requests it ran on, and why it could not run on the others."""
    return row_lines(coverage_rows(coverage))


def gap_lines(gaps: Mapping[str, Mapping[str, int]], *, server: bool = False) -> list[str]:
    """For every required check that could not run: on how many requests, why, and what the
    engine must return to enable it (``server``: what a server's user can set instead)."""
    hints = {**HINTS, **SERVER_HINTS} if server else HINTS
    return [
        f"  {check}: {n} request(s) with {reason}"
        + (f": {hints[reason]}" if reason in hints else "")
        for check, reasons in gaps.items()
        for reason, n in reasons.items()
    ]
