"""The checks as pure functions: comparison rules, protocol faults, merges, reuse bounds."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_prefixcache import Message, Outcome, Request
from pytest_prefixcache.checks import (
    fault_problems,
    merge_problems,
    pair_problems,
    reuse_problems,
)
from pytest_prefixcache.checks.equivalence import Tolerance, compare
from pytest_prefixcache.checks.oracle import Match
from pytest_prefixcache.checks.problem import Problem
from pytest_prefixcache.images import make_image
from pytest_prefixcache.verify.messages import Context, describe_request, format_failure

REQ = Request((Message("user", ("hi",)),), max_new_tokens=2)


def logits(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def out(x: np.ndarray, **kw: object) -> Outcome:
    return Outcome(logits=x, **kw)  # type: ignore[arg-type]


def test_exact_comparison_reports_first_and_worst() -> None:
    u = logits(1, 2, 3, 4, 5, 6)
    c = logits(1, 2.5, 3, 4, 2, 6)
    cmp = compare(out(c), out(u), Tolerance())
    assert cmp.first_bad is not None and cmp.worst_bad is not None
    assert (cmp.first_bad.index, cmp.worst_bad.index, cmp.worst_bad.diff) == (1, 4, 3.0)
    [p] = cmp.problems
    assert p.headline == "logits differ beyond the tolerance (exact) at 1 of 1 step(s)"
    assert p.details[0].startswith("first difference: step 0 (last prompt position), token id 1")


def test_identical_outcomes_have_no_problems() -> None:
    x = logits(1, 2, 3)
    cmp = compare(out(x, tokens=(2, 1), step_logits=(x, x)), out(x.copy(), tokens=(2, 1),
                  step_logits=(x, x.copy())), Tolerance())  # fmt: skip
    assert cmp.problems == [] and cmp.worst_diff == 0.0 and cmp.steps == 2


def test_tolerances() -> None:
    u, c = logits(1, 2, 3), logits(1, 2, 3.00001)
    assert compare(out(c), out(u), Tolerance()).problems
    assert not compare(out(c), out(u), Tolerance(atol=1e-4)).problems
    assert not compare(out(c), out(u), Tolerance(rtol=1e-4)).problems
    assert compare(out(c), out(u), Tolerance(rtol=1e-7)).problems


def test_nan_is_a_difference() -> None:
    cmp = compare(out(logits(1, np.nan)), out(logits(1, 2)), Tolerance(atol=1.0))
    assert cmp.problems and cmp.worst_diff == np.inf


def test_every_step_and_greedy_tokens_are_compared() -> None:
    a, b = logits(0, 1, 2), logits(0, 1, 2.5)
    cached = out(a, tokens=(2, 2), step_logits=(a, b))
    uncached = out(a, tokens=(2, 2), step_logits=(a, a))
    cmp = compare(cached, uncached, Tolerance())
    assert cmp.bad_steps == [1]
    assert "step 1 (before new token 1)" in cmp.problems[0].details[0]
    tok = compare(out(a, tokens=(2, 1)), out(a, tokens=(2, 0)), Tolerance())
    assert tok.problems[0].headline.startswith("greedy tokens differ at new token 1")


def test_a_near_tie_may_flip_tokens_under_a_tolerance() -> None:
    tie = logits(0, 1.0, 1.0000001)
    cached = out(tie, tokens=(1,), step_logits=(tie,))
    uncached = out(tie, tokens=(2,), step_logits=(tie,))
    assert compare(cached, uncached, Tolerance()).problems
    assert not compare(cached, uncached, Tolerance(atol=1e-5)).problems


def test_top_logprobs_exact_and_kl() -> None:
    u = {1: -0.1, 2: -2.5, 3: -3.0, 4: -4.0, 5: -5.0}
    same = Outcome(top_logprobs=dict(u))
    assert not compare(same, Outcome(top_logprobs=u), Tolerance()).problems
    other_keys = Outcome(top_logprobs={**u, 6: -5.5})
    assert compare(other_keys, Outcome(top_logprobs=u), Tolerance()).problems
    drift = Outcome(top_logprobs={k: v + 1e-4 for k, v in u.items()})
    assert compare(drift, Outcome(top_logprobs=u), Tolerance()).problems
    assert not compare(drift, Outcome(top_logprobs=u), Tolerance(kl=1e-3)).problems
    flipped = Outcome(top_logprobs={1: -2.5, 2: -0.1, 3: -3.0, 4: -4.0, 5: -5.0})
    bad = compare(flipped, Outcome(top_logprobs=u), Tolerance(kl=1e-3))
    assert bad.problems[0].headline.startswith("step 0: estimated KL")


def test_kl_rule_on_full_logits() -> None:
    rng = np.random.default_rng(0)
    u = rng.standard_normal(50).astype(np.float32)
    assert not compare(out(u + np.float32(1e-3)), out(u), Tolerance(kl=1e-4)).problems
    assert compare(
        out(rng.standard_normal(50).astype(np.float32)), out(u), Tolerance(kl=1e-2)
    ).problems


@pytest.mark.parametrize(
    ("outcome", "says"),
    [
        ("not an outcome", "run() returned a str, not an Outcome"),
        (Outcome(), "the Outcome has neither logits nor top_logprobs"),
        (out(logits(1, np.inf)), "logits holds 1 non-finite value(s), first inf at token id 1"),
        (out(np.zeros(3)), "logits has dtype float64, expected float32"),
        (out(np.zeros((2, 3), np.float32)), "logits has shape (2, 3), expected (vocab_size,)"),
        (out(logits(1), tokens=(1, 2, 3)), "3 new tokens for max_new_tokens=2"),
        (out(logits(1), cached_tokens=5, prompt_tokens=4), "cached_tokens=5 exceeds prompt_"),
        (out(logits(1), cached_tokens=-1), "cached_tokens=-1 is negative"),
        (out(logits(1), prompt_tokens=3, token_ids=(1, 2)), "prompt_tokens=3 but token_ids has 2"),
        (Outcome(top_logprobs={1: -0.5}), "top_logprobs has 1 entries, expected at least 5"),
        (out(logits(1), image_spans=((0, 2, "ab" * 32),)), "image_spans name images [abab"),
        (out(logits(1), step_logits=(logits(1, 2),)), "step_logits[0] has shape (2,) but"),
    ],
)  # fmt: skip
def test_fault_problems(outcome: object, says: str) -> None:
    problems = fault_problems(outcome, REQ)
    assert any(p.headline.startswith(says) for p in problems), problems
    assert all(p.check == "fault" for p in problems)


def test_a_well_formed_outcome_has_no_faults() -> None:
    img = make_image("solid", 16, 16)
    req = Request((Message("user", (img, "x")),))
    o = out(logits(1, 2), cached_tokens=2, prompt_tokens=5, token_ids=(1, 9, 9, 2, 3),
            image_spans=((1, 3, img.digest),), merges=((1, 1),))  # fmt: skip
    assert fault_problems(o, req) == [] and merge_problems(o) == []


def test_merges() -> None:
    span = ((10, 20, "d" * 64),)
    bad = merge_problems(out(logits(1), merges=((4, 10),), image_spans=span, cached_tokens=16))
    assert bad[0].headline == "vision merge 0 filled 4 placeholder slots with 10 embedding rows"
    short = merge_problems(out(logits(1), merges=((2, 2),), image_spans=span, cached_tokens=12))
    assert short[0].headline.startswith("merges filled 2 placeholder slots but 8 placeholders")


def test_pair_problems() -> None:
    a = out(logits(1), token_ids=(1, 2, 3))
    b = out(logits(1), token_ids=(1, 5, 3))
    assert "differ between runs from position 1" in pair_problems(a, b)[0].headline
    assert pair_problems(out(logits(1, 2)), out(logits(1)))[0].check == "fault"


def test_reuse_bound() -> None:
    m = Match(max_reuse=10, shared=11, source=0)
    assert reuse_problems(out(logits(1), cached_tokens=10), m) == []
    [p] = reuse_problems(out(logits(1), cached_tokens=16), m)
    assert p.headline == "cached_tokens=16 exceeds the maximum valid reuse of 10 tokens"
    assert reuse_problems(out(logits(1)), m) == []  # not reported: nothing to check


def test_message_names_everything_a_bug_report_needs() -> None:
    a, b = make_image("solid", 16, 16, seed=1), make_image("solid", 16, 16, seed=2)
    r0 = Request((Message("user", (a, "what colour?")),))
    r1 = Request((Message("user", (b, "what colour?")),), namespace="t", max_new_tokens=1)
    cached = out(logits(1), cached_tokens=8, prompt_tokens=10, token_ids=tuple(range(10)),
                 image_spans=((2, 6, b.digest),))  # fmt: skip
    text = format_failure(
        Problem("equivalence", "logits differ", ("first difference: ...",)),
        Context((r0, r1), 1, cached, Match(2, 2, 0), "pytest --prefixcache-replay=x"),
    )
    assert text.splitlines()[:3] == [
        "equivalence: logits differ",
        "  at request 1 of a stream of 2 (counting from 0)",
        "  first difference: ...",
    ]
    assert "cached_tokens=8 of prompt_tokens=10; oracle maximum valid reuse 2, shared with " \
        "request 0" in text  # fmt: skip
    assert f"image span involved: [2, 6) digest {b.digest[:12]} (image 0 of 1" in text
    assert text.endswith("  replay: pytest --prefixcache-replay=x")
    assert describe_request(r1) == (
        f"namespace='t', max_new_tokens=1 | user: [image 16x16 {b.digest[:12]}] 'what colour?'"
    )


def test_positive_control() -> None:
    from pytest_prefixcache.checks import control_problems

    prev = Request((Message("user", ("x" * 10,)),))
    grown = Request((*prev.messages, Message("assistant", ("ok",)), Message("user", ("more",))))
    other = Request((Message("user", ("y",)),))
    big, small = Match(100, 100, 0), Match(10, 10, 0)
    miss = out(logits(1), cached_tokens=0)
    [p] = control_problems(prev, prev, miss, big)
    assert p.headline.startswith("an identical repeat of the previous request reused 0 tokens")
    [p] = control_problems(grown, prev, miss, big)
    assert p.headline.startswith("an append-only next turn")
    assert control_problems(grown, prev, out(logits(1), cached_tokens=16), big) == []
    assert control_problems(grown, prev, miss, small) == []  # below CONTROL_MIN_TOKENS
    assert control_problems(other, prev, miss, big) == []  # not a repeat or a next turn
    moved = Request(prev.messages, namespace="t")
    assert control_problems(moved, prev, miss, big) == []  # another namespace


def test_scenario_expectations() -> None:
    from pytest_prefixcache.checks.render import expectation_problems

    a = (out(logits(1), token_ids=(1, 2, 3, 4)), None)
    same = (out(logits(1), token_ids=(1, 2, 3, 4)), None)
    changed = (out(logits(1), token_ids=(1, 9, 3, 4)), None)
    grown = (out(logits(1), token_ids=(1, 2, 3, 4, 5, 6)), None)
    assert list(expectation_problems([a, same], [[0, 1]])) == []
    [(j, p, meta)] = expectation_problems([a, changed], [[0, 1]])
    assert (j, p.check, meta) == (1, "render hygiene", {"expect_same_prompt": [[0, 1]]})
    assert p.headline == "request 1's prompt should equal request 0's (4 tokens) but shares " \
        "only its first 1 tokens (now 4 tokens)"  # fmt: skip
    assert list(expectation_problems([a, grown], [[0, 1]], extends=True)) == []
    blind = (out(logits(1), cached_tokens=0), None)
    [(_, p, _)] = expectation_problems([blind, blind], [[0, 1]])
    assert p.headline == "request 1 should reuse request 0's prompt but reused 0 tokens"


def test_a_fresh_instance_that_decodes_other_tokens_names_both_sides() -> None:
    """No logit differs, the greedy tokens do: the baseline problem names this run and the
    fresh one (not "unthis run")."""
    from pytest_prefixcache.checks import Tolerance, fresh_problems

    same = logits(1, 2, 3)
    [p] = fresh_problems(
        out(same, tokens=(1,)), out(same, tokens=(1,)), out(same, tokens=(2,)), Tolerance()
    )
    assert p.check == "cold baseline"
    assert p.details[0] == (
        "uncached: greedy tokens differ at new token 0: this run (1,) vs fresh (2,)"
    )
