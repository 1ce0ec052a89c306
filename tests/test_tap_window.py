"""A reply's rows far behind the tap's window of recent records, and what the tap says when no
track answers a reply (issue #32, the mlx-vlm #1916 rows: "no tap record ends at the prompt
length 22: the tap recorded 256 call(s) ... with KV offsets 22, ..., none equal to the prompt
length 22").

The window (``tracks._RECENT``) only feeds that message: a reply is attributed from the
ledger's tracks, built from every call read. So a request whose prefill is hundreds of calls
back (a long wave of decode steps) is still found; the message counts every call, not the
window, and no longer says "none equal" of an offset it lists."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from test_tap_tracks import ledger, row

from pytest_prefixcache.tap import TapRecord, find_prompt_call, missing_reason
from pytest_prefixcache.tap.tracks import _RECENT, TapLedger

A = [1, 2, 3, 4, 5]  # the request judged late
B = [6, 7]  # another request, decoding long after A's prefill


def _long_wave() -> list[tuple[str, list[dict]]]:
    """A's prefill and 3 decode steps, then more than a window of B's decode steps."""
    calls: list[tuple[str, list[dict]]] = [("a", [row(0, 5, A, 3)])]
    calls += [("a", [row(5 + k, 6 + k, [3], 3)]) for k in range(3)]
    calls.append(("b", [row(0, 2, B, 4)]))
    calls += [("b", [row(2 + k, 3 + k, [4], 4)]) for k in range(_RECENT + 40)]
    return calls


def test_a_prefill_older_than_the_window_is_still_attributed(tmp_path: Path) -> None:
    led = ledger(tmp_path, _long_wave())
    found = led.find(len(A), A, 4)
    assert found is not None and [r.after for r in found.steps] == [5, 6, 7, 8]
    assert found.ids_checked is True and found.reused == 0
    # negative control: the window of records alone has lost A's prefill
    assert len(led.records()) == _RECENT and led.calls == _RECENT + 45
    assert find_prompt_call(led.records(), len(A)) is None


def test_a_message_counts_every_call_and_names_the_window(tmp_path: Path) -> None:
    led = ledger(tmp_path, _long_wave())
    led.refresh()
    why = missing_reason(led.records(), 9, ["m:M"], led.calls)
    assert f"{_RECENT + 45} call(s) (the latest {_RECENT} shown)" in why
    # without the total (the old message) the window's size passed for the count
    old = missing_reason(led.records(), 9, ["m:M"])
    assert f"recorded {_RECENT} call(s) of" in old and "latest" not in old


def _rec(offset: int) -> TapRecord:
    return TapRecord(0, "m.Model", 1, 1, offset, np.zeros(2, dtype=np.float32))


def test_an_offset_listed_is_not_called_missing() -> None:
    why = missing_reason([_rec(22), _rec(23)], 22, ["m:Model"])
    assert "none equal" not in why and "no track of the ledger answers" in why
    why = missing_reason([_rec(22), _rec(23)], 40, ["m:Model"])  # control: really missing
    assert "22, 23, none equal to the prompt length 40" in why


def test_explain_names_the_admitted_requests_rows(tmp_path: Path) -> None:
    # A's request labelled "7", admitted under reply id "r1"; its only row is padded at 5
    led = ledger(tmp_path, [("a", [{**row(0, 6, [*A, 0], 3, pad=1), "id": "7"}])])
    with (tmp_path / "tap.jsonl").open("a") as f:
        f.write(json.dumps({"admit": "7", "reply": "r1", "by": "x", "pid": 1}) + "\n")
    assert led.find(5, A, 1, reply_id="r1") is None
    why = led.explain(5, "r1")
    assert "admitted as '7'" in why and "are 6: 0->6+1:" in why and "prompt length 5" in why
    assert led.explain(5, "r2") == ""  # not admitted: no unpadded row ends at 5 either
    with (tmp_path / "tap.jsonl").open("a") as f:
        f.write(json.dumps({"admit": "9", "reply": "r3", "by": "x", "pid": 1}) + "\n")
    assert "admitted the reply as '9' but no row carried that label" in led.explain(5, "r3")


def test_explain_names_tracks_claimed_by_other_replies(tmp_path: Path) -> None:
    led = ledger(tmp_path, [("a", [row(0, 5, A, 3)])])
    found = led.find(5, A, 1)
    assert found is not None and led.claim(found)
    assert led.find(5, A, 1) is None
    assert "1 track(s)" in led.explain(5) and "1 claimed" in led.explain(5)
    assert led.explain(9) == ""  # control: nothing ends there, missing_reason's case


def _admitted(tmp_path: Path, calls: list[tuple[str, list[dict]]]) -> TapLedger:
    led = ledger(tmp_path, calls)
    with (tmp_path / "tap.jsonl").open("a") as f:
        f.write(json.dumps({"admit": "1", "reply": "r", "by": "x", "pid": 1}) + "\n")
    return led


def _labelled(b: int, a: int, n: int, pad: int = 0, held: int = 0) -> dict:
    return {**row(b, a, [1] * n, 3, pad=pad), "id": "1", "pb": held}


# The schedule the tap recorded on mlx-vlm 0.6.13 and 0.6.14 (tiny-gemma3, a wave of 4): a
# 361-token prompt with 345 reused, its 16 new tokens right-padded beside a cold row, chunks of
# 8, 236 and 16 columns; its tokens end 8 columns into the second chunk, the last call
# (``PromptProcessingBatch.generate``) holds only its padding, then it decodes from 361.
SHORT_ROW = [
    ("p", [_labelled(345, 353, 8)]),
    ("p", [_labelled(353, 589, 236, pad=228)]),
    ("p", [_labelled(361, 377, 16, pad=16, held=228)]),  # as recorded: pb 228
    ("g", [_labelled(361, 362, 1)]),
]


def test_a_first_token_sampled_after_padding_only_is_named_the_servers(tmp_path: Path) -> None:
    led = _admitted(tmp_path, SHORT_ROW)
    assert led.find(361, None, 2, reply_id="r") is None
    why = led.explain(361, "r")
    assert "inside the right-padded chunk 353->589+228" in why
    assert "(361->377+16) fed it only padding" in why and "an engine fault" in why


def test_a_row_ending_at_a_chunk_boundary_is_attributed(tmp_path: Path) -> None:
    # negative control (mlx-vlm 0.7 stops the chunk where the short row's tokens end)
    calls = [
        ("p", [_labelled(345, 353, 8)]),
        ("p", [_labelled(353, 361, 8)]),
        ("p", [_labelled(361, 589, 228, pad=228)]),
        ("g", [_labelled(361, 362, 1)]),
    ]
    led = _admitted(tmp_path, calls)
    found = led.find(361, None, 2, reply_id="r")
    assert found is not None and [r.after for r in found.steps] == [361, 362]
    # and a padded end whose next call holds real positions is not called padding-only
    (tmp_path / "m").mkdir()
    mixed = [*SHORT_ROW[:2], ("p", [_labelled(361, 377, 16, pad=8)]), SHORT_ROW[3]]
    assert "engine fault" not in _admitted(tmp_path / "m", mixed).explain(361, "r")
