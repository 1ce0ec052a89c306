"""A Hypothesis state machine over the block pool, against a small dict model.

Invariants after every step: reference counts never negative and equal to the model's;
resident bytes never exceed max_bytes and equal the sum over stored blocks; a block in use is
never evicted; every stored digest maps to a block whose parent, tokens and extras match the
key it was stored under; lookups return exactly the model's longest stored chain, and partial
lookups the stored child valid for the most positions (``agreeing_prefix`` over the stored
blocks); a superseded tail never stays resident once released; ``on_drop`` is called exactly
once for every stored block the pool lets go of (evicted, superseded or cleared), so the
payloads not yet dropped are exactly those of the stored blocks.

The benchmark budget (at least 10,000 checked steps) is
``python benchmarks/pool_machine.py``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from reference_engine.blocks import BlockKey, agreeing_prefix, block_keys, namespace_root
from reference_engine.pool import Block, BlockPool

BLOCK = 4
MAX_BYTES = 100
STEPS = int(os.environ.get("PREFIXCACHE_POOL_STEPS", "60"))
EXAMPLES = int(os.environ.get("PREFIXCACHE_POOL_EXAMPLES", "40"))

# a small universe of prompts that share prefixes, so chains overlap
PROMPTS = [
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
    [1, 2, 3, 4, 5, 6, 7, 8, 13, 14, 15, 16],
    [1, 2, 3, 4, 17, 18, 19, 20],
    [21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36],
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],  # partial tails, prefixes of prompt 0
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 14],
    [1, 2, 3, 4, 5, 6, 7, 8, 13, 14, 15],  # a tail under prompt 1's image
]
SPANS = [[], [(8, 12, "c" * 64)], [(4, 8, "d" * 64)], [], [], [], [(10, 11, "e" * 64)]]
N = len(PROMPTS) - 1
ROOTS = [namespace_root("m", ""), namespace_root("m", "tenant")]


def chain(prompt: int, ns: int) -> list[BlockKey]:
    return block_keys(PROMPTS[prompt], SPANS[prompt], block_size=BLOCK, root=ROOTS[ns])


class PoolMachine(RuleBasedStateMachine):
    checked_steps = 0  # invariant checks run, across examples (the benchmark prints it)

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[bytes, int] = {}  # payloads stored and not dropped (a digest each)
        self.pool = BlockPool(MAX_BYTES, on_drop=self._dropped)
        self.held: list[list[Block]] = []  # acquisitions not yet released
        self.refs: dict[bytes, int] = {}  # model: digest -> expected refcount
        self.keys: dict[bytes, BlockKey] = {}  # model: what each digest was stored under

    def _dropped(self, payload: bytes) -> None:
        assert self.live.get(payload, 0) == 1, "a block was dropped twice, or never stored"
        self.live[payload] -= 1

    def _acquired(self, blocks: list[Block]) -> None:
        for b in blocks:
            self.refs[b.key.digest] = self.refs.get(b.key.digest, 0) + 1
        self.held.append(blocks)

    @rule(prompt=st.integers(0, N), ns=st.integers(0, 1))
    def lookup(self, prompt: int, ns: int) -> None:
        keys = chain(prompt, ns)
        stored = {b.key.digest for b in self.pool.blocks()}
        expected = 0
        for k in keys:
            if k.digest not in stored:
                break
            expected += 1
        hits = self.pool.lookup(keys)
        assert [b.key.digest for b in hits] == [k.digest for k in keys[:expected]]
        self._acquired(hits)

    @rule(prompt=st.integers(0, N), ns=st.integers(0, 1), size=st.integers(1, 40))
    def insert(self, prompt: int, ns: int, size: int) -> None:
        stored: list[Block] = []
        for key in chain(prompt, ns):
            in_use_before = {d for d, n in self.refs.items() if n > 0}
            new = key.digest not in self.pool
            block = self.pool.insert(key, payload=key.digest, nbytes=size)
            if block is None:
                break
            if new:
                self.live[key.digest] = self.live.get(key.digest, 0) + 1
            # nothing that was in use was evicted to make room
            assert in_use_before <= {b.key.digest for b in self.pool.blocks()}
            self.keys.setdefault(key.digest, key)
            stored.append(block)
        self._acquired(stored)
        self.pool.touch(stored)

    @rule(prompt=st.integers(0, N), ns=st.integers(0, 1))
    def lookup_partial(self, prompt: int, ns: int) -> None:
        keys = chain(prompt, ns)
        hits = self.pool.lookup(keys)
        self._acquired(hits)
        if len(hits) == len(keys):
            return
        wanted = keys[len(hits)]
        expected = max(
            (
                agreeing_prefix(b.key, wanted)
                for b in self.pool.blocks()
                if b.key.parent == wanted.parent and b.key.index == wanted.index
            ),
            default=0,
        )
        found = self.pool.lookup_partial(wanted)
        assert (found[1] if found else 0) == expected
        if found is not None:
            assert found[0].key.parent == wanted.parent
            self._acquired([found[0]])

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 1000))
    def release(self, i: int) -> None:
        blocks = self.held.pop(i % len(self.held))
        self.pool.release(blocks)
        for b in blocks:
            self.refs[b.key.digest] -= 1

    @rule()
    def reset(self) -> None:
        self.pool.clear()

    @invariant()
    def refcounts_match_the_model(self) -> None:
        for b in self.pool.blocks():
            assert b.refcount >= 0
            assert b.refcount == self.refs.get(b.key.digest, 0)
        for digest, n in self.refs.items():
            assert n >= 0
            if n > 0:
                assert digest in self.pool, "a block in use was evicted"

    @invariant()
    def bytes_are_accounted(self) -> None:
        PoolMachine.checked_steps += 1
        blocks = self.pool.blocks()
        assert self.pool.resident_bytes == sum(b.nbytes for b in blocks)
        # the budget holds except for blocks kept because they are in use across a reset
        assert self.pool.resident_bytes <= MAX_BYTES

    @invariant()
    def dropped_payloads_are_exactly_the_ones_gone(self) -> None:
        assert {d for d, n in self.live.items() if n} == {b.payload for b in self.pool.blocks()}

    @invariant()
    def superseded_blocks_are_in_use(self) -> None:
        for b in self.pool.blocks():
            assert not b.superseded or b.refcount > 0

    @invariant()
    def stored_blocks_match_their_keys(self) -> None:
        for b in self.pool.blocks():
            key = self.keys[b.key.digest]
            assert b.matches(key) and b.payload == key.digest


PoolMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.large_base_example,
        HealthCheck.data_too_large,
    ],
)
TestPool = PoolMachine.TestCase


def test_negative_control_the_machine_catches_a_leaky_release() -> None:
    """A pool whose release forgets to decrement must fail the refcount invariant."""
    import pytest

    class Leaky(BlockPool):
        def release(self, blocks):  # type: ignore[override]
            list(blocks)

    class LeakyMachine(PoolMachine):
        def __init__(self) -> None:
            super().__init__()
            self.pool = Leaky(MAX_BYTES)

    LeakyMachine.TestCase.settings = settings(
        max_examples=200, stateful_step_count=20, deadline=None, database=None
    )
    with pytest.raises(AssertionError):
        LeakyMachine.TestCase().runTest()


@pytest.mark.slow
def test_negative_control_the_machine_catches_a_drop_nobody_hears_of() -> None:
    """A pool that evicts without calling ``on_drop`` must fail the dropped-payloads invariant
    (the reference engine would keep the evicted rows' memory alive)."""
    import pytest

    class Silent(BlockPool):
        def _drop(self, digest: bytes) -> None:
            on_drop, self.on_drop = self.on_drop, None
            try:
                super()._drop(digest)
            finally:
                self.on_drop = on_drop

    class SilentMachine(PoolMachine):
        def __init__(self) -> None:
            super().__init__()
            self.pool = Silent(MAX_BYTES, on_drop=self._dropped)

    SilentMachine.TestCase.settings = settings(
        max_examples=200, stateful_step_count=30, deadline=None, database=None
    )
    with pytest.raises(AssertionError):
        SilentMachine.TestCase().runTest()
