"""A reply whose request never computed its prompt's last position (the rapid-mlx #994 rows,
0.9.10 on tiny-llama: an exact repeat of a 22-token prompt resumed from a cache holding all 22
and fed the last prompt token again, rows 22->23 and 23->24): the tap names the duplicate
position instead of only saying that no row ends at the prompt length."""

from __future__ import annotations

import json
from pathlib import Path

from test_tap_tracks import ledger, row

from pytest_prefixcache.tap.tracks import TapLedger


def _admitted(tmp_path: Path, calls: list[tuple[str, list[dict]]]) -> TapLedger:
    led = ledger(tmp_path, calls)
    with (tmp_path / "tap.jsonl").open("a") as f:
        f.write(json.dumps({"admit": "1", "reply": "r", "by": "x", "pid": 1}) + "\n")
    return led


def _labelled(b: int, a: int, n: int, pad: int = 0) -> dict:
    return {**row(b, a, [1] * n, 3, pad=pad), "id": "1"}


def test_a_first_row_at_the_prompt_length_is_named_a_duplicate_position(tmp_path: Path) -> None:
    led = _admitted(tmp_path, [("g", [_labelled(22, 23, 1)]), ("g", [_labelled(23, 24, 1)])])
    assert led.find(22, None, 2, reply_id="r") is None
    why = led.explain(22, "r")
    assert "are 1: 22->23, 1: 23->24" in why
    assert "starts at KV offset 22, at or past the prompt length 22" in why
    assert "a duplicate KV position" in why


def test_a_resume_one_short_of_the_prompt_is_attributed_and_not_named(tmp_path: Path) -> None:
    # negative control (0.9.11: the exact hit trimmed by one, the last token at 21->22)
    led = _admitted(tmp_path, [("g", [_labelled(21, 22, 1)]), ("g", [_labelled(22, 23, 1)])])
    found = led.find(22, None, 2, reply_id="r")
    assert found is not None and found.reused == 21
    # and a track whose first row starts inside the prompt gets no such reason
    (tmp_path / "b").mkdir()
    short = _admitted(tmp_path / "b", [("g", [_labelled(10, 11, 1)])])
    assert "duplicate" not in short.explain(22, "r")
