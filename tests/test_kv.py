"""Stored KV rows (``reference_engine.kv``): one segment per request, a window per block.

What is checked: a restore from windows of several segments holds exactly the rows they
cover, in chain order, and a chain stored by one request restores as one run; a window
outside its segment is refused; and memory stays what the pool accounts for: after every
request of a stream under a small byte budget, the KV the pool's blocks keep alive (each
segment once) equals the pool's resident bytes, with every segment holding only live
windows. The negative control leaves compaction out and must break that equality.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("mlx.core")

import mlx.core as mx
from test_engine import BS, assistant, compare, img, req, user

from pytest_prefixcache import Message
from reference_engine import Engine, default_model_path
from reference_engine.kv import Segment, Segments, Window, _runs, copy_segment


class _Layer:
    def __init__(self, keys: Any, values: Any) -> None:
        self.keys, self.values = keys, values


def _cache(rows: int, seed: int, layers: int = 2) -> list[_Layer]:
    """A stand-in KV cache of random rows, (1, 2 heads, rows, 4)."""
    out = []
    for i in range(layers):
        k = mx.random.normal((1, 2, rows, 4), key=mx.random.key(1000 * seed + 2 * i))
        v = mx.random.normal((1, 2, rows, 4), key=mx.random.key(1000 * seed + 2 * i + 1))
        out.append(_Layer(k, v))
    return out


def test_restore_holds_the_windows_rows_in_chain_order(model: Any) -> None:
    a, b = _cache(40, 1), _cache(40, 2)
    seg_a, seg_b = copy_segment(a, 0, 32), copy_segment(b, 8, 40)
    # a chain: rows 0-15 of A, then rows 8-23 of B's segment (cache rows 16-31), then a
    # partial block: the first 5 rows of A's rows 16-31
    chain = [seg_a.window(0, 16), seg_b.window(8, 16), seg_a.window(16, 16)]
    tokens = 16 + 16 + 5
    cache = model.restore(chain, tokens, capacity=tokens + 3)
    for layer in range(2):
        for kind in ("keys", "values"):
            want = mx.concatenate(
                [
                    getattr(a[layer], kind)[:, :, 0:16],
                    getattr(b[layer], kind)[:, :, 16:32],
                    getattr(a[layer], kind)[:, :, 16:21],
                ],
                axis=2,
            )
            got = getattr(cache[layer], kind)[:, :, :tokens]
            assert mx.array_equal(got, want).item()
            assert cache[layer].offset == tokens
            assert getattr(cache[layer], kind).shape[2] >= tokens + 3  # room to append


def test_a_chain_stored_by_one_request_restores_as_one_run() -> None:
    seg = copy_segment(_cache(64, 3), 0, 64)
    windows = [seg.window(16 * i, 16) for i in range(4)]
    assert _runs(windows, 60) == [(seg, 0, 60)]
    other = copy_segment(_cache(16, 4), 0, 16)
    mixed = [windows[0], windows[1], other.window(0, 16), windows[3]]
    assert [(s is seg, o, n) for s, o, n in _runs(mixed, 64)] == [
        (True, 0, 32),
        (False, 0, 16),
        (True, 48, 16),
    ]


def test_bad_windows_and_token_counts_are_refused() -> None:
    seg = copy_segment(_cache(16, 5), 0, 16)
    with pytest.raises(ValueError, match="outside a segment of 16 rows"):
        seg.window(8, 16)
    with pytest.raises(ValueError, match=r"\[3, 3\)"):
        copy_segment(_cache(16, 5), 3, 3)
    with pytest.raises(ValueError, match="17 tokens from blocks of"):
        _runs([seg.window(0, 16)], 17)


def test_compaction_keeps_the_live_windows_rows_and_frees_the_rest() -> None:
    source = _cache(48, 6)
    seg = copy_segment(source, 0, 48)
    windows = [seg.window(16 * i, 16) for i in range(3)]
    before = [w.layers() for w in windows]
    segments = Segments()
    segments.track(windows)
    segments.dropped(windows[1])
    assert segments.compact() == 16
    assert windows[0].segment is windows[2].segment is not seg
    assert windows[0].segment.rows == 32 and not windows[1].alive
    for w, rows in ((windows[0], before[0]), (windows[2], before[2])):
        for (k, v), (k0, v0) in zip(w.layers(), rows):
            assert mx.array_equal(k, k0).item() and mx.array_equal(v, v0).item()
    assert segments.compact() == 0  # nothing dirty any more


def _resident_kv(engine: Engine) -> tuple[int, list[Window]]:
    """Bytes of the segments the pool's blocks keep alive, and their windows."""
    segments: dict[int, Segment] = {}
    for block in engine.pool.blocks():
        segments[id(block.payload.segment)] = block.payload.segment
    windows = [w for s in segments.values() for w in engine.segments.members(s)]
    return sum(s.nbytes for s in segments.values()), windows


BUDGET = 300_000  # about 36 blocks of 8 KiB: two or three short conversations


def _stream() -> list[Any]:
    """Three conversations growing in turn, so the budget evicts the leaves of the older
    chains (parts of segments) while later turns hit their prefixes."""
    text = " ".join(f"note{i}" for i in range(30))
    histories: list[list[Any]] = [[Message("system", (f"Agent {n}. {text}",))] for n in range(3)]
    out = []
    for turn in range(4):
        for n, history in enumerate(histories):
            history.append(user(f"Turn {turn}: {text[: 20 * (n + 1)]}", img(turn % 3)))
            out.append(req(*history))
            history.append(assistant(f"Reply {turn} to agent {n}."))
    return out


@pytest.mark.parametrize("compacts", [True, False], ids=["engine", "no_compaction"])
def test_the_kv_kept_alive_is_what_the_pool_accounts_for(model: Any, compacts: bool) -> None:
    engine = Engine(model, block_size=BS, max_bytes=BUDGET)
    if not compacts:
        engine.segments.compact = lambda: 0  # type: ignore[method-assign]
    mismatches = []
    for i, request in enumerate(_stream()):
        engine.run(request)
        kept, windows = _resident_kv(engine)
        assert engine.pool.resident_bytes <= BUDGET
        if kept != engine.pool.resident_bytes or not all(w.alive for w in windows):
            mismatches.append((i, kept, engine.pool.resident_bytes))
    assert engine.stats.evictions > 0  # the budget did evict
    if compacts:
        assert mismatches == []
    else:
        assert mismatches, "without compaction, evicted rows must stay alive in their segments"


def test_a_compacted_chain_still_restores_bit_exact(model: Any) -> None:
    """Under a budget that evicts (and so compacts) every turn, warm equals cold."""
    engine = Engine(model, block_size=BS, max_bytes=BUDGET)
    stream = _stream()
    compare(engine, stream[:-1], stream[-1])
    assert engine.stats.evictions > 0 and engine.stats.hit_tokens > 0


def test_segments_are_per_request_not_per_block(model: Any) -> None:
    engine = Engine.from_pretrained(default_model_path(), block_size=BS)
    engine.run(_stream()[0])
    blocks = engine.pool.blocks()
    assert len(blocks) > 3
    assert len({id(b.payload.segment) for b in blocks}) == 1


def test_the_kv_store_keeps_only_the_windows_the_pool_takes() -> None:
    """A store whose first block is stored already and whose third does not fit: their
    windows die at once, and compaction leaves the new segment with the one block taken."""
    from reference_engine.blocks import block_keys, namespace_root
    from reference_engine.kv import KVStore
    from reference_engine.pool import BlockPool

    keys = block_keys(list(range(48)), [], block_size=16, root=namespace_root("m"))
    store = KVStore(model=None)  # type: ignore[arg-type]  # restore is not used here
    pool = BlockPool(max_bytes=2 * 2048, on_drop=store.dropped)  # two blocks of 16 rows
    store.store(pool, _cache(48, 7), keys[:1], block_size=16)
    store.store(pool, _cache(48, 8), keys, block_size=16)
    first, second = sorted(pool.blocks(), key=lambda b: b.key.index)
    assert len(pool) == 2 and second.key == keys[1] and first.payload.segment.rows == 16
    assert all(b.refcount == 0 for b in pool.blocks())
    assert store.compact() == 32
    assert second.payload.segment.rows == 16
    assert store.segments.members(second.payload.segment) == [second.payload]
