"""The tap's inference (rows without a scheduler label) when a request finishes before its twin.

mlx_lm.server 0.31.2 on tiny-gemma3-text, a wave of 6 (the tap's records, labels kept): uids 1
and 3 have the same prompt, uid 2 sits between them in the decode batch; uid 1 finishes and is
filtered out, and the next call's rows are [0, 2, 3, 4, 5]. Read without the labels, the first
fit in row order gave uid 1's finished track uid 3's row (a twin follows its twin's row: the
same offset and greedy token), after which uid 2's row could not be taken in order and started
a track of its own: 143 prefills counted for the 140 requests that server admitted (the same
records read by their labels: 140). The tracks now take as many rows as can continue them in
order (:func:`pytest_prefixcache.tap.rows.in_order`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from test_tap_tracks import ledger, row

from pytest_prefixcache.tap import TapRow
from pytest_prefixcache.tap.rows import Track, in_order

P = [1, 2, 3, 4]  # the twins' prompt
Q = [1, 5, 6, 7]  # the request between them


def _calls(after_finish: list[dict]) -> list[tuple[str, list[dict]]]:
    """Three requests prefilled together (P, Q, P), one decode step each (greedy: P -> 2 -> 1,
    Q -> 6 -> 7), then the first P finished: the call after it."""
    return [
        ("p", [row(0, 4, P, 2), row(0, 4, Q, 6), row(0, 4, P, 2)]),
        ("g", [row(4, 5, [2], 1), row(4, 5, [6], 7), row(4, 5, [2], 1)]),
        ("g", after_finish),
    ]


FINISHED = [row(5, 6, [7], 3), row(5, 6, [1], 4)]  # Q's step, the second P's step


def test_a_finished_twin_leaves_the_other_tracks_their_rows(tmp_path: Path) -> None:
    led = ledger(tmp_path, _calls(FINISHED))
    for _ in range(3):
        led.count_sent()
    led.refresh()
    assert led.received == 3 and led.count_problem() == ""
    q = led.find(4, Q, 3)
    assert q is not None and [r.after for r in q.steps] == [4, 5, 6]  # Q's rows, in one track
    assert [t.index for t in led.tracks] == [0, 1, 2]


def test_a_row_that_continues_no_track_is_still_a_prefill(tmp_path: Path) -> None:
    # the negative control: a server that computed Q's prompt again (a second prefill from 0)
    # and a request resumed from 3 positions nobody computed: both start tracks of their own,
    # the count says so and the resumed one shows its reuse (what the reuse bound judges)
    again = ("p2", [row(0, 4, Q, 6), row(3, 7, [4, 5, 6, 7], 2)])
    led = ledger(tmp_path, [*_calls(FINISHED), again])
    for _ in range(3):
        led.count_sent()
    led.refresh()
    assert led.received == 5
    assert "ran 5 prefill(s)" in led.count_problem()
    assert [led.tracks[i].rows[0][1].real_before for i in (3, 4)] == [0, 3]


def _tap_row(before: int, ids: list[int], top: int) -> TapRow:
    v = np.full(8, -5.0, dtype=np.float32)
    v[top] = -0.1
    return TapRow(before, before + len(ids), 0, tuple(ids), v)


def _prefilled(ids: list[int], top: int, then: int) -> Track:
    t = Track(0, 1, "1:g", 0, 0)
    t.add(_tap_row(0, ids, top), len(ids))
    t.add(_tap_row(len(ids), [top], then), 1)  # a decode step fed its greedy token
    return t


def test_in_order_takes_as_many_rows_as_it_can() -> None:
    twin, between, other_twin = _prefilled(P, 2, 1), _prefilled(Q, 6, 7), _prefilled(P, 2, 1)
    rows = [_tap_row(5, [7], 3), _tap_row(5, [1], 4)]  # Q's step, a P step: the twin finished
    got = in_order([twin, between, other_twin], rows, 1, [0, 1])
    assert got == {0: between, 1: other_twin}
    # two twins and both their rows: the earliest track the earliest row, as before
    got = in_order([twin, other_twin], [rows[1], _tap_row(5, [1], 4)], 1, [3, 4])
    assert got == {3: twin, 4: other_twin}
    # the first fit, for contrast: the finished twin takes the P row and Q's is left over
    assert twin.follows(rows[1], 1) and not twin.follows(rows[0], 1)
