"""The three references side by side on hand-built prompts (the token oracle, the
snapshot-aware reference, block granularity), the positive control's three diagnoses, the
efficiency floor's reference, and how an engine declares its design."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pytest_prefixcache import CacheDesign, EngineError, Message, Outcome, Request
from pytest_prefixcache.checks import (
    CAPACITY,
    NO_SNAPSHOT,
    OLDER_ENTRY,
    UNDER_ONE_BLOCK,
    control_problems,
    efficiency_problem,
    fault_problems,
)
from pytest_prefixcache.checks.oracle import Match, ReuseOracle
from pytest_prefixcache.checks.references import block_reuse, boundaries, last_boundary

START, PAD = 270, 9
A, B, C = "a" * 64, "b" * 64, "c" * 64
SNAPSHOT = CacheDesign("snapshot")


def render(*messages: tuple[str, ...]) -> tuple[list[int], list[tuple[int, int, str]], list[int]]:
    """Token ids, image spans and message starts of a chat whose messages are parts: a text
    part ``"t12:5"`` is 12 tokens of value 5, an image part is its digest (4 placeholders);
    each message opens with START; a generation prompt (START) ends the prompt."""
    ids: list[int] = []
    spans: list[tuple[int, int, str]] = []
    starts: list[int] = []
    for parts in messages:
        starts.append(len(ids))
        ids.append(START)
        for part in parts:
            if part.startswith("t"):
                n, value = part[1:].split(":")
                ids += [int(value)] * int(n)
            else:
                spans.append((len(ids), len(ids) + 4, part))
                ids += [PAD] * 4
    return [*ids, START], spans, starts


def oracle_after(
    earlier: tuple[list[int], list[tuple[int, int, str]], list[int]],
    design: CacheDesign = SNAPSHOT,
    *,
    starts_known: bool = True,
) -> ReuseOracle:
    o = ReuseOracle(design)
    ids, spans, starts = earlier
    o.add(0, "", ids, spans, starts if starts_known else None)
    return o


def test_a_growing_chat_reuses_the_whole_earlier_prompt_under_every_reference() -> None:
    sys_, u1 = ("t30:1",), ("t20:2",)
    earlier = render(sys_, u1)  # 30+1 + 20+1 + 1 = 53 tokens
    ids, spans, _ = render(sys_, u1, ("t10:3",), ("t5:4",))
    m = oracle_after(earlier, CacheDesign("block", 16)).match("", ids, spans)
    assert (m.max_reuse, m.snapshot, m.block) == (53, 53, 48)  # the earlier prompt's end
    assert m.boundary_source == 0 and m.allowed == 48


def test_a_new_user_message_after_a_shared_system_prompt_resumes_at_its_start() -> None:
    sys_ = ("t40:1",)
    ids, spans, _ = render(sys_, ("t20:2",))
    earlier = render(sys_, ("t20:3",))
    m = oracle_after(earlier).match("", ids, spans)
    # the token oracle shares the user message's START too; a snapshot exists at its start
    assert (m.max_reuse, m.snapshot, m.allowed, m.starts_known) == (42, 41, 41, True)
    blind = oracle_after(earlier, starts_known=False).match("", ids, spans)
    assert (blind.max_reuse, blind.snapshot, blind.starts_known) == (42, 0, False)
    assert "snapshot-aware 0 at request 0 (message boundaries unknown)" in blind.references()


def test_a_replaced_image_in_a_later_turn_resumes_at_the_image_edge() -> None:
    turn1 = (("t30:1",), ("t10:2", A), ("t10:3",))
    earlier = render(*turn1, ("t6:4", B, "t3:5", "t3:6"))
    b_start, b_end, _ = earlier[1][1]
    ids, spans, _ = render(*turn1, ("t6:4", C, "t3:5", "t3:6"))
    m = oracle_after(earlier).match("", ids, spans)
    assert m.max_reuse == m.snapshot == b_start  # an image edge is a boundary
    # a text after the image replaced: the token oracle goes on, the snapshot stops at the
    # image's end (the last boundary before the difference)
    ids2, spans2, _ = render(*turn1, ("t6:4", B, "t3:5", "t3:7"))
    m2 = oracle_after(earlier).match("", ids2, spans2)
    assert (m2.max_reuse, m2.snapshot) == (b_end + 3, b_end)


def test_swapped_images_share_only_up_to_the_first_image() -> None:
    earlier = render(("t20:1", A, B, "t4:2"))
    ids, spans, _ = render(("t20:1", B, A, "t4:2"))
    m = oracle_after(earlier).match("", ids, spans)
    assert m.max_reuse == m.snapshot == 21  # START + 20 text tokens, then the images differ


def test_an_identical_repeat_resumes_at_the_last_boundary_before_its_end() -> None:
    prompt = render(("t40:1",), ("t30:2",))
    ids, spans, starts = prompt
    m = oracle_after(prompt).match("", ids, spans)
    assert (m.max_reuse, m.snapshot) == (len(ids) - 1, starts[-1])  # the end is not allowed
    blind = oracle_after(prompt, starts_known=False).match("", ids, spans)
    assert blind.snapshot == 0


def test_a_prefix_shorter_than_one_block_reuses_nothing_in_blocks() -> None:
    earlier = render(("t10:1",))
    ids, spans, _ = render(("t10:1",), ("t10:2",))
    m = oracle_after(earlier, CacheDesign("block", 16)).match("", ids, spans)
    assert (m.max_reuse, m.block, m.allowed) == (12, 0, 0)
    token = oracle_after(earlier, CacheDesign()).match("", ids, spans)
    assert token.block is None and token.allowed == 12  # no block size: no block reference


def test_namespaces_and_the_helpers() -> None:
    o = oracle_after(render(("t40:1",)))
    ids, spans, _ = render(("t40:1",), ("t3:2",))
    other = o.match("t", ids, spans)
    assert (other.max_reuse, other.snapshot, other.source) == (0, 0, None)
    assert boundaries(10, [(2, 6, A)], [0, 8]) == (0, 2, 6, 8, 10)
    assert boundaries(10, [], None) == (10,)
    assert last_boundary((0, 2, 6), 5) == 2 and last_boundary((3,), 2) == 0
    assert block_reuse(47, 16) == 32


# -- the positive control -------------------------------------------------------------------
PREV = Request((Message("user", ("x",)),))
NEXT = Request((*PREV.messages, Message("assistant", ("ok",)), Message("user", ("more",))))
MISS = Outcome(logits=np.zeros(4, np.float32), cached_tokens=0)


def match(token: int, snapshot: int, design: CacheDesign = SNAPSHOT, **kw: object) -> Match:
    block = None if design.block_size is None else block_reuse(token, design.block_size)
    return Match(token, token, 0, snapshot=snapshot, boundary_source=0, block=block,
                 design=design, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_control_nothing_stored_names_the_declared_reference() -> None:
    [p] = control_problems(NEXT, PREV, MISS, match(130, 120))
    assert p.check == "positive control"
    assert p.headline == (
        "an append-only next turn of the previous request reused 0 tokens; the snapshot-aware "
        "reference says 120 were reusable"
    )
    assert p.details[0].startswith("nothing stored: the cache never stores")
    assert p.details[1] == (
        "reuse references: token oracle 130, snapshot-aware 120 at request 0; judged against "
        "the snapshot-aware reference"
    )


def test_control_of_a_token_cache_hints_at_the_snapshot_design() -> None:
    [p] = control_problems(PREV, PREV, MISS, match(100, 0, CacheDesign()))
    assert p.check == "positive control"
    assert p.headline.endswith("the token oracle says 100 were reusable")
    assert "declare reuse_reference = 'snapshot'" in p.details[-1]
    # a snapshot reference that allows enough: no hint
    [q] = control_problems(PREV, PREV, MISS, match(100, 90, CacheDesign()))
    assert len(q.details) == 2


def test_control_no_snapshot_at_that_boundary_is_a_finding() -> None:
    [p] = control_problems(PREV, PREV, MISS, match(100, 12))
    assert p.check == NO_SNAPSHOT
    assert p.headline == (
        "an identical repeat of the previous request reused 0 tokens; the token oracle says "
        "100 were reusable, but the longest boundary of request 0 within the shared prefix is "
        "12 (< 64): no snapshot at that boundary"
    )
    assert "not a failure" in p.details[0]


def test_control_under_one_block_is_a_finding() -> None:
    blocks = CacheDesign("block", 256)
    [p] = control_problems(NEXT, PREV, MISS, match(100, 100, blocks))
    assert p.check == UNDER_ONE_BLOCK
    assert p.headline.endswith(
        "the token oracle says 100 were reusable, but the shared prefix is shorter than one "
        "block (256 tokens)"
    )
    [q] = control_problems(NEXT, PREV, MISS, match(100, 100, CacheDesign("block", 48)))
    assert q.check == "positive control"  # 96 whole-block tokens: enough for the control
    assert q.headline.endswith("the block reference (blocks of 48) says 96 were reusable")
    [r] = control_problems(NEXT, PREV, MISS, match(70, 70, CacheDesign("block", 48)))
    assert r.headline.endswith("but its whole blocks of 48 tokens hold only 48 (< 64)")


def test_control_stays_silent_where_it_did() -> None:
    assert control_problems(NEXT, PREV, MISS, match(63, 63)) == []  # the token oracle < 64
    hit = Outcome(logits=np.zeros(4, np.float32), cached_tokens=4)
    assert control_problems(NEXT, PREV, hit, match(130, 0)) == []  # something was reused
    other = Request((Message("user", ("y",)),))
    assert control_problems(other, PREV, MISS, match(130, 0)) == []  # not a next turn


def test_the_oracle_says_what_the_most_recent_prompt_alone_leaves() -> None:
    """``Match.recent``: the declared reference applied to the namespace's last prompt only
    (0 here, where the 100 shared tokens come from an older prompt), None with no history."""
    blocks = CacheDesign("block", 32)
    o = ReuseOracle(blocks)
    assert o.match("", [1] * 10, []).recent is None
    o.add(0, "", [1] * 100 + [2], [])
    o.add(1, "", [7] * 50, [])
    m = o.match("", [1] * 100 + [3], [])
    assert (m.block, m.source, m.recent) == (96, 0, 0)
    o.add(2, "", [1] * 70, [])
    assert o.match("", [1] * 100 + [3], []).recent == 64  # 70 shared: two whole blocks
    o.add(3, "", [5] * 4, [])
    assert o.match("other", [5] * 4, []).recent is None  # per namespace


def test_control_from_an_older_request_only_is_a_finding() -> None:
    """What only a request older than the previous one left may have been evicted (a cache of
    bounded capacity): a finding. The negative control: when the previous request itself left
    enough, missing it still fails."""
    older = dataclasses.replace(match(130, 130, CacheDesign()), recent=12)
    [p] = control_problems(NEXT, PREV, MISS, older)
    assert p.check == OLDER_ENTRY
    assert p.headline.endswith(
        "the token oracle says 130 were reusable, but from request 0: the previous request "
        "leaves only 12"
    )
    assert "not a failure" in p.details[0]
    recent = dataclasses.replace(older, recent=64)
    [q] = control_problems(NEXT, PREV, MISS, recent)
    assert q.check == "positive control"


def test_control_after_runs_larger_than_the_cache_is_a_finding() -> None:
    """The previous request's cached and uncached runs stored 2 x 300 tokens in a cache of
    320: the uncached run may have evicted the prefix, a finding. The negative control: a
    cache that holds both runs (or no capacity declared) still fails."""
    big = match(130, 130, CacheDesign())
    [p] = control_problems(PREV, PREV, MISS, big, capacity=320, footprint=300)
    assert p.check == CAPACITY
    assert p.headline.endswith(
        "but the previous request's cached and uncached runs stored 600 tokens in a cache "
        "that holds 320"
    )
    assert "not a failure" in p.details[0]
    [q] = control_problems(PREV, PREV, MISS, big, capacity=600, footprint=300)
    assert q.check == "positive control"
    [r] = control_problems(PREV, PREV, MISS, big, footprint=300)
    assert r.check == "positive control"


def test_efficiency_floor_names_the_declared_reference() -> None:
    p = efficiency_problem(10, 100, 0.5, SNAPSHOT)
    assert p is not None and p.headline.startswith("the cache reused 10 of 100 reusable tokens")
    assert "reusable according to the snapshot-aware reference" in p.details[1]
    assert "too few snapshots" in p.details[0]
    q = efficiency_problem(10, 100, 0.5)
    assert q is not None and "the token oracle" in q.details[1]


# -- declaring a design -------------------------------------------------------------------------
class Declared:
    def __init__(self, **attrs: object) -> None:
        self.__dict__.update(attrs)


def test_an_engine_declares_its_design_with_attributes() -> None:
    assert CacheDesign.of(Declared()) == CacheDesign()
    assert CacheDesign.of(Declared(reuse_reference="snapshot")) == SNAPSHOT
    # a block size alone (the reference engine keeps blocks, reuses to the token) is not one
    assert CacheDesign.of(Declared(block_size=16)) == CacheDesign()
    assert CacheDesign.of(Declared(reuse_reference="block", block_size=16)).block_size == 16
    with pytest.raises(EngineError, match=r"Declared: reuse_reference='blocks' is not one of"):
        CacheDesign.of(Declared(reuse_reference="blocks"))
    with pytest.raises(EngineError, match=r"reuse_reference='block' needs a block_size"):
        CacheDesign.of(Declared(reuse_reference="block"))
    with pytest.raises(EngineError, match=r"block_size=16 is for reuse_reference='block' only"):
        CacheDesign("snapshot", 16)
    with pytest.raises(EngineError, match=r"block_size=0 is not a positive int"):
        CacheDesign("block", 0)
    assert SNAPSHOT.label == "the snapshot-aware reference"
    assert CacheDesign("block", 16).label == "the block reference (blocks of 16)"


@pytest.mark.parametrize(
    ("starts", "problem"),
    [
        ((0, 5, 5), "message_starts [0, 5, 5] are not strictly ascending"),
        ((0, 9, 4), "message_starts [0, 9, 4] are not strictly ascending"),
        ((0, 12), "message_starts holds [12], outside the prompt's positions [0, 12)"),
        ((-1, 3), "message_starts holds [-1], outside the prompt's positions [0, 12)"),
        ((0, 2.5), "message_starts must be a tuple of ints, got (0, 2.5)"),
        ((True,), "message_starts must be a tuple of ints, got (True,)"),
    ],
)
def test_protocol_refuses_bad_message_starts(starts: tuple[int, ...], problem: str) -> None:
    req = Request((Message("user", ("hi",)),))
    o = Outcome(logits=np.zeros(4, np.float32), token_ids=tuple(range(12)), message_starts=starts)
    assert [p.headline for p in fault_problems(o, req)] == [problem]
    ok = Outcome(logits=np.zeros(4, np.float32), token_ids=tuple(range(12)), message_starts=(0, 11))
    assert fault_problems(ok, req) == []


def test_every_failure_message_names_the_references_once() -> None:
    from pytest_prefixcache.checks.problem import Problem
    from pytest_prefixcache.verify.messages import Context, format_failure

    cached = Outcome(logits=np.zeros(4, np.float32), cached_tokens=0, prompt_tokens=200)
    m = match(130, 120)
    plain = Problem("equivalence", "logits differ")
    text = format_failure(plain, Context((NEXT,), 0, cached, m))
    line = "  reuse references: token oracle 130, snapshot-aware 120 at request 0; judged " \
        "against the snapshot-aware reference"  # fmt: skip
    assert text.splitlines().count(line) == 1
    [p] = control_problems(NEXT, PREV, MISS, m)
    assert format_failure(p, Context((PREV, NEXT), 1, cached, m)).splitlines().count(line) == 1
    bare = Match(2, 2, 0)  # built by hand: no other reference
    assert "reuse references" not in format_failure(plain, Context((NEXT,), 0, cached, bare))
