"""Block keys and the block pool, without a model."""

from __future__ import annotations

import pytest

from reference_engine.blocks import block_keys, extra_keys, namespace_root
from reference_engine.pool import BlockPool

ROOT = namespace_root("model", "")
A = "a" * 64
B = "b" * 64


def keys(tokens, spans=(), root=ROOT, bs=4):
    return block_keys(tokens, spans, block_size=bs, root=root)


def test_only_full_blocks_get_keys():
    assert len(keys(list(range(11)))) == 2
    assert len(keys(list(range(12)))) == 3


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
