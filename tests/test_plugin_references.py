"""End to end: each engine is judged against the reference its design declares. A snapshot
cache (``reuse_reference = "snapshot"``) that resumes at the previous prompt's end passes the
positive control; the same cache with no snapshots fails it, saying nothing was stored; a
cache that reuses to the token passes under the token oracle; and the report shows reuse
against every reference side by side."""

from __future__ import annotations

from pathlib import Path

import pytest
from plugin_support import with_fakes

pytest_plugins = ["pytester"]

SNAPSHOT_ENGINES = Path(__file__).with_name("snapshot_engines.py").read_text(encoding="utf-8")

STREAMS = """
from pytest_prefixcache import Message, Request

SYSTEM = Message("system", ("You are a careful assistant who plans before acting. " * 3,))
ASK = Message("user", ("Describe the plan in detail, step by step, for the whole team. " * 2,))
FIRST = Request((SYSTEM, ASK), max_new_tokens=2)
NEXT = Request(
    (*FIRST.messages, Message("assistant", ("Step one, then step two, then review. " * 3,)),
     Message("user", ("Go on with the next step please, and say why. " * 2,))),
    max_new_tokens=2,
)


def test_growing_chat(prefixcache_verify):
    first, second = prefixcache_verify([FIRST, NEXT])
    assert second.cached.cached_tokens == len(first.cached.token_ids)
    assert second.match.snapshot == second.match.max_reuse == second.cached.cached_tokens


def test_edit_inside_the_last_message(prefixcache_verify):
    edited = Request((SYSTEM, Message("user", (ASK.content[0][:-2] + "!",))), max_new_tokens=2)
    prefixcache_verify([FIRST, edited])


def test_identical_repeat(prefixcache_verify):
    prefixcache_verify([FIRST, FIRST])
"""


def run(pytester: pytest.Pytester, engine: str, *args: str) -> pytest.RunResult:
    with_fakes(pytester)
    pytester.makepyfile(snapshotengines=SNAPSHOT_ENGINES, test_streams=STREAMS)
    return pytester.runpytest(
        "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning",
        f"--prefixcache-engine=snapshotengines:{engine}", "--prefixcache-seed=1", *args,
    )  # fmt: skip


def test_a_snapshot_cache_resuming_at_the_previous_prompts_end_passes(
    pytester: pytest.Pytester,
) -> None:
    result = run(pytester, "at_prompt_ends", "-k", "growing_chat")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "cache efficiency vs the snapshot-aware reference: 100.0% (* of * reusable tokens)",
            "reuse per reference: token oracle 100.0% (*), snapshot-aware 100.0% (*); judged "
            "against the snapshot-aware reference",
            "failures by check: none",
        ]
    )


def test_the_same_cache_without_snapshots_fails_the_control_saying_nothing_was_stored(
    pytester: pytest.Pytester,
) -> None:
    result = run(pytester, "no_snapshots", "-k", "growing_chat")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E   *PositiveControlFailure: positive control: an append-only next turn of the "
            "previous request reused 0 tokens; the snapshot-aware reference says * were reusable",
            "E   *at request 1 of a stream of 2 (counting from 0)",
            "E   *nothing stored: the cache never stores, drops every entry, or its key changes "
            "between turns",
            "E   *reuse references: token oracle *, snapshot-aware * at request 0; judged against "
            "the snapshot-aware reference",
        ]
    )


def test_a_token_granular_cache_passes_under_the_token_oracle(pytester: pytest.Pytester) -> None:
    result = run(pytester, "token_granular", "--prefixcache-min-efficiency=0.99")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "cache efficiency vs the token oracle: 100.0% (* of * reusable tokens)",
            "reuse per reference: token oracle 100.0% *; judged against the token oracle",
        ]
    )


def test_a_snapshot_cache_is_efficient_against_its_own_reference_only(
    pytester: pytest.Pytester,
) -> None:
    declared = run(pytester, "snapshot", "-k", "edit", "--prefixcache-min-efficiency=0.9")
    declared.assert_outcomes(passed=1)
    declared.stdout.fnmatch_lines(["cache efficiency vs the snapshot-aware reference: 100.0% *"])
    # negative control: the same cache, not declared, is judged against the token oracle
    silent = run(pytester, "snapshot_declared_token", "-k", "edit",
                 "--prefixcache-min-efficiency=0.9")  # fmt: skip
    silent.assert_outcomes(failed=1)
    silent.stdout.fnmatch_lines(
        [
            "E   *EfficiencyFailure: min efficiency: the cache reused * of * reusable tokens "
            "(*%), below --prefixcache-min-efficiency=0.9",
            "E   *reusable according to the token oracle, the engine's declared design",
        ]
    )


def test_no_snapshot_at_a_boundary_is_a_finding_not_a_failure(pytester: pytest.Pytester) -> None:
    result = run(pytester, "at_prompt_ends_blind", "-k", "identical_repeat")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "reuse per reference: token oracle 0.0% (0 of *), snapshot-aware n/a (0 of 0); "
            "judged against the snapshot-aware reference; message boundaries unknown on 2 "
            "request(s)",
            "efficiency findings (not failures; see the README's tiers): snapshot boundary: 1",
            "  snapshot boundary: request 1: an identical repeat of the previous request reused 0 "
            "tokens; the token oracle says * were reusable, but the longest boundary of request 0 "
            "within the shared prefix is 0 (< 64): no snapshot at that boundary",
        ]
    )
    # with message starts, the cache is expected to resume at the last message's start
    result = run(pytester, "at_prompt_ends", "-k", "identical_repeat")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E   *PositiveControlFailure: positive control: an identical *"])
    assert run(pytester, "snapshot", "-k", "identical_repeat").ret == 0


def test_a_snapshot_cache_passes_the_whole_suite(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makepyfile(snapshotengines=SNAPSHOT_ENGINES)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning",
        "--prefixcache-verify", "--prefixcache-engine=snapshotengines:snapshot",
        "--prefixcache-examples=5", "--prefixcache-seed=1",
    )  # fmt: skip
    result.assert_outcomes(passed=7, skipped=1)  # test_waves: no max_concurrency declared
    result.stdout.fnmatch_lines(["failures by check: none", "verdict: PASS"])
