"""Block keys and the block pool, without a model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_engine.blocks import agreeing_prefix, block_keys, extra_keys, namespace_root
from reference_engine.pool import BlockPool, Reuse

ROOT = namespace_root("model", "")
A = "a" * 64
B = "b" * 64


def keys(tokens, spans=(), root=ROOT, bs=4):
    return block_keys(tokens, spans, block_size=bs, root=root)


def test_full_blocks_and_the_partial_tail_get_keys():
    k11, k12 = keys(list(range(11))), keys(list(range(12)))
    assert [len(k.tokens) for k in k11] == [4, 4, 3]
    assert [len(k.tokens) for k in k12] == [4, 4, 4]
    assert k11[:2] == k12[:2]
    # the tail is chained like a block, and its length is in the hash: 3 tokens of a
    # block never share a key with a block that starts with them
    assert k11[2].parent == k11[1].digest and k11[2].digest != k12[2].digest
    assert keys([]) == []


def test_keys_are_chained_and_stable():
    k1 = keys([1, 2, 3, 4, 5, 6, 7, 8])
    k2 = keys([9, 2, 3, 4, 5, 6, 7, 8])
    assert k1[1].tokens == k2[1].tokens
    assert k1[1].digest != k2[1].digest  # same block after a different prefix
    assert keys([1, 2, 3, 4, 5, 6, 7, 8])[1].digest == k1[1].digest
    assert k1[0].digest == keys([1, 2, 3, 4])[0].digest  # block 0 ignores what follows


def test_image_digest_and_offset_enter_the_key():
    ids = [7] * 12
    a = keys(ids, [(2, 10, A)])
    b = keys(ids, [(2, 10, B)])
    assert all(x.digest != y.digest for x, y in zip(a, b))
    assert a[0].extras == ((A, -2),) and a[1].extras == ((A, 2),) and a[2].extras == ((A, 6),)
    # an image that ends before a block does not touch its key
    c = keys([1, 2, 3, 4, 5, 6, 7, 8], [(0, 4, A)])
    d = keys([1, 2, 3, 4, 5, 6, 7, 8], [(0, 4, B)])
    assert c[1].extras == () and c[1].digest != d[1].digest  # but the chain carries it


def test_image_order_matters():
    ids = [7] * 8
    ab = keys(ids, [(0, 4, A), (4, 8, B)])
    ba = keys(ids, [(0, 4, B), (4, 8, A)])
    assert ab[0].digest != ba[0].digest and ab[1].digest != ba[1].digest


def test_namespace_is_folded_into_block_zero():
    ids = [1, 2, 3, 4]
    assert (
        keys(ids, root=namespace_root("m", "t1"))[0].digest
        != keys(ids, root=namespace_root("m", "t2"))[0].digest
    )
    assert namespace_root("ab", "c") != namespace_root("a", "bc")


def test_extra_keys_overlap_rule():
    assert extra_keys(0, 4, [(4, 8, A)]) == ()
    assert extra_keys(4, 8, [(4, 8, A)]) == ((A, 0),)
    assert extra_keys(0, 4, [(3, 8, A), (1, 2, B)]) == ((A, -3), (B, -1))


def test_pool_lookup_insert_release_and_eviction():
    pool = BlockPool(max_bytes=30)
    ks = keys(list(range(16)))
    for k in ks[:3]:
        assert pool.insert(k, payload=k.index, nbytes=10) is not None
    assert [b.refcount for b in pool.blocks()] == [1, 1, 1]  # held by the inserter
    assert len(pool.lookup(ks)) == 3
    assert [b.refcount for b in pool.blocks()] == [2, 2, 2]
    pool.release(pool.blocks())  # the insert references
    pool.release(pool.blocks())  # the lookup's
    assert [b.refcount for b in pool.blocks()] == [0, 0, 0]
    hits = pool.lookup(ks)
    assert [b.payload for b in hits] == [0, 1, 2]
    # full and everything in use: the fourth block cannot be stored
    assert pool.insert(ks[3], payload=3, nbytes=10) is None
    pool.release(hits)
    assert pool.insert(ks[3], payload=3, nbytes=10) is not None
    assert pool.stats.evictions == 1
    assert pool.resident_bytes == 30
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release([b for b in pool.blocks() if b.refcount == 0][:1])


def test_pool_touch_keeps_chain_roots_longest():
    pool = BlockPool(max_bytes=40)
    ks = keys(list(range(16)))
    stored = [pool.insert(k, k.index, 10) for k in ks]
    pool.touch(stored)
    pool.release(stored)
    other = keys([99] * 4)[0]
    assert pool.insert(other, "x", 10) is not None
    # the leaf of the chain went first, the root stayed
    assert [b.payload for b in pool.lookup(ks)] == [0, 1, 2]


def test_hit_is_confirmed_not_just_hashed():
    pool = BlockPool(max_bytes=100)
    k = keys([1, 2, 3, 4])[0]
    forged = type(k)(k.index, k.digest, k.parent, (9, 9, 9, 9), k.extras)
    pool.release([pool.insert(k, "real", 10)])
    assert pool.lookup([forged]) == []
    assert pool.stats.collisions == 1


def test_keys_are_stable_across_processes():
    import subprocess
    import sys

    code = (
        "from reference_engine.blocks import block_keys, namespace_root;"
        "ks = block_keys([5, 6, 7, 8, 9, 10, 11, 12], [(2, 6, 'ab' * 32)], block_size=4,"
        " root=namespace_root('m', 't'));"
        "print(ks[-1].digest.hex())"
    )
    env = {"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()
    here = block_keys(
        [5, 6, 7, 8, 9, 10, 11, 12],
        [(2, 6, "ab" * 32)],
        block_size=4,
        root=namespace_root("m", "t"),
    )
    assert out == here[-1].digest.hex()


def test_key_encoding_is_pinned():
    """The digest of a fixed prompt with overlapping images, as every version since the
    format's v1 computed it: a faster ``block_keys`` must not change a key."""
    spans = [(2, 6, "ab" * 32), (5, 13, "cd" * 32), (13, 14, "ef" * 32)]
    ks = block_keys(list(range(3, 21)), spans, block_size=4, root=namespace_root("m", "t"))
    assert ks[-1].digest.hex() == (
        "59bf0383fc84fdca3afc60b77c239dde8b34262a044b687670e07cdcacb83d9b"
    )


@settings(max_examples=200, deadline=None, database=None)
@given(
    n=st.integers(1, 60),
    bs=st.integers(1, 9),
    raw=st.lists(st.tuples(st.integers(0, 59), st.integers(1, 12)), max_size=5),
)
def test_block_extras_are_the_overlapping_images_in_span_order(n, bs, raw):
    spans = []
    cursor = 0
    for i, (start, length) in enumerate(sorted(raw)):
        start = max(start, cursor)
        end = min(n, start + length)
        if start < end:
            spans.append((start, end, f"{i:064d}"))
            cursor = end
    for k in keys(list(range(n)), spans, bs=bs):
        start = k.index * bs
        assert k.extras == extra_keys(start, start + len(k.tokens), spans)


def test_agreeing_prefix_counts_equal_tokens_and_clamps_at_a_different_image():
    base = keys([1, 2, 3, 4, 5, 6, 7, 8])[1]
    other = keys([1, 2, 3, 4, 5, 6, 9, 9])[1]
    assert agreeing_prefix(base, base) == 4
    assert agreeing_prefix(base, other) == agreeing_prefix(other, base) == 2
    tail = keys([1, 2, 3, 4, 5, 6])[1]
    assert agreeing_prefix(base, tail) == agreeing_prefix(tail, base) == 2
    # identical placeholder tokens, a different image starting at position 1 of the block
    ids = [1, 2, 3, 4, 5, 7, 7, 7]
    a, b = keys(ids, [(5, 8, A)])[1], keys(ids, [(5, 8, B)])[1]
    assert agreeing_prefix(a, b) == 1
    # the same image at another offset behind identical tokens
    c = keys([1, 2, 3, 4, 5, 7, 7, 7, 7], [(6, 9, A)])[1]
    assert agreeing_prefix(a, c) == 1
    assert agreeing_prefix(a, keys(ids, [(5, 8, A)])[1]) == 4


def test_lookup_partial_acquires_the_child_valid_for_the_most_positions():
    pool = BlockPool(max_bytes=1000)
    stored = keys([1, 2, 3, 4, 5, 6, 7, 8]) + keys([1, 2, 3, 4, 5, 9, 9])[1:]
    for k in stored:
        pool.release([pool.insert(k, k.tokens, 10)])
    wanted = keys([1, 2, 3, 4, 5, 6, 0, 0, 0])
    hits = pool.lookup(wanted)
    assert [b.key.index for b in hits] == [0]
    found = pool.lookup_partial(wanted[1])
    assert found is not None and found[1] == 2 and found[0].payload == (5, 6, 7, 8)
    assert found[0].refcount == 1 and pool.stats.partial_hits == 1
    # nothing valid: a first token that differs, or another parent
    assert pool.lookup_partial(keys([1, 2, 3, 4, 0, 6])[1]) is None
    assert pool.lookup_partial(keys([0, 2, 3, 4, 5, 6])[1]) is None
    pool.release([*hits, found[0]])
    assert all(b.refcount == 0 for b in pool.blocks())


def test_reuse_decides_the_length_and_holds_exactly_the_blocks_it_returns():
    pool = BlockPool(max_bytes=1000)
    for k in keys([1, 2, 3, 4, 5, 6, 7, 8]):
        pool.release([pool.insert(k, k.tokens, 10)])
    wanted = keys([1, 2, 3, 4, 5, 6, 0, 0, 0])
    mid_block = pool.reuse(wanted, 9, block_size=4)
    assert mid_block.tokens == 6 and [b.key.index for b in mid_block.blocks] == [0, 1]
    assert [b.refcount for b in pool.blocks()] == [1, 1]
    pool.release(mid_block.blocks)
    whole = pool.reuse(wanted, 9, block_size=4, partial=False)
    assert whole.tokens == 4 and [b.key.index for b in whole.blocks] == [0]
    pool.release(whole.blocks)
    repeat = pool.reuse(keys([1, 2, 3, 4, 5, 6, 7, 8]), 8, block_size=4)
    assert repeat.tokens == 7 and len(repeat.blocks) == 2  # one token is always computed
    pool.release(repeat.blocks)
    # the cap leaves block 1 without a row to give: it is not held
    short = pool.reuse(keys([1, 2, 3, 4, 5]), 5, block_size=4)
    assert short.tokens == 4 and [b.key.index for b in short.blocks] == [0]
    pool.release(short.blocks)
    assert all(b.refcount == 0 for b in pool.blocks())
    assert pool.reuse(keys([9, 9, 9, 9, 9]), 5, block_size=4) == Reuse()


def test_a_tail_is_superseded_by_the_block_that_extends_it_once_released():
    pool = BlockPool(max_bytes=1000)
    tail = keys([1, 2, 3, 4, 5, 6])
    for k in tail:
        pool.release([pool.insert(k, k.tokens, 10 if len(k.tokens) == 4 else 5)])
    assert pool.covered(tail[1]) and pool.resident_bytes == 15
    held = pool.lookup_partial(keys([1, 2, 3, 4, 5, 6, 7, 8])[1])
    assert held is not None and held[1] == 2
    full = keys([1, 2, 3, 4, 5, 6, 7, 8])[1]
    pool.release([pool.insert(full, full.tokens, 10)])
    assert held[0].key.digest in pool  # in use: kept until released
    pool.release([held[0]])
    assert held[0].key.digest not in pool and pool.stats.superseded == 1
    assert pool.resident_bytes == 20 == sum(b.nbytes for b in pool.blocks())
    # a shorter tail is covered by the stored full block: nothing to store
    assert pool.covered(keys([1, 2, 3, 4, 5])[1])
    assert not pool.covered(keys([1, 2, 3, 4, 5, 0])[1])


def test_a_key_chain_hashes_on_demand_and_equals_block_keys(monkeypatch):
    from reference_engine import blocks as blocks_mod
    from reference_engine.blocks import KeyChain

    tokens, spans = list(range(3, 30)), [(5, 13, "cd" * 32)]
    want = keys(tokens, spans)
    hashed = []
    real = blocks_mod.hash_block
    monkeypatch.setattr(blocks_mod, "hash_block", lambda *a: hashed.append(a[1]) or real(*a))
    chain = KeyChain(tokens, spans, block_size=4, root=ROOT)
    assert len(chain) == len(want) == 7 and hashed == []
    assert chain[1] == want[1] and len(hashed) == 2  # blocks 0 and 1, nothing further
    pool = BlockPool(1000)
    assert pool.lookup(chain) == [] and len(hashed) == 2  # a miss at block 0
    assert chain[-1] == want[-1] and chain[2:4] == want[2:4] and list(chain) == want
    assert chain.complete() == want and len(hashed) == 7  # each block hashed once
    with pytest.raises(IndexError, match="block 7 of 7"):
        chain[7]
