"""The report shows reuse against every reference side by side, judges efficiency against the
declared one, and says so in the terminal summary, the JSON report and the HTML page."""

from __future__ import annotations

import re

from pytest_prefixcache.checks import CacheDesign
from pytest_prefixcache.checks.oracle import Match
from pytest_prefixcache.html import render_html
from pytest_prefixcache.output.report import Report
from pytest_prefixcache.output.reuse import add_reuse


def report(design: CacheDesign, *reuse: tuple[int, int, int]) -> Report:
    """A report that counted (cached_tokens, token oracle, snapshot-aware) per request."""
    r = Report(engine="m:e", reference=design.reference, block_size=design.block_size)
    for cached, token, snapshot in reuse:
        block = (
            None if design.block_size is None else token // design.block_size * design.block_size
        )
        add_reuse(r, cached, Match(token, token, 0, snapshot=snapshot, block=block, design=design))
        r.requests += 1
    return r


def test_a_token_cache_is_judged_against_the_token_oracle() -> None:
    r = report(CacheDesign(), (100, 100, 40), (30, 60, 60))
    assert r.efficiency == 130 / 160
    lines = r.lines()
    assert "cache efficiency vs the token oracle: 81.2% (130 of 160 reusable tokens)" in lines
    assert (
        "reuse per reference: token oracle 81.2% (130 of 160), snapshot-aware 70.0% (70 of 100); "
        "judged against the token oracle"
    ) in lines


def test_a_snapshot_cache_is_judged_against_the_snapshot_aware_reference() -> None:
    r = report(CacheDesign("snapshot"), (40, 100, 40), (60, 60, 60))
    r.starts_unknown = 3
    assert r.efficiency == 1.0
    lines = r.lines()
    assert "cache efficiency vs the snapshot-aware reference: 100.0% (100 of 100 reusable " \
        "tokens)" in lines  # fmt: skip
    assert (
        "reuse per reference: token oracle 62.5% (100 of 160), snapshot-aware 100.0% (100 of "
        "100); judged against the snapshot-aware reference; message boundaries unknown on 3 "
        "request(s)"
    ) in lines
    data = r.to_json()
    assert (data["reference"], data["efficiency"], data["oracle_tokens"]) == ("snapshot", 1.0, 160)
    assert (data["snapshot_reused"], data["snapshot_tokens"], data["starts_unknown"]) == (
        100,
        100,
        3,
    )
    again = Report.from_json(data)
    assert again.lines() == lines


def test_a_block_cache_shows_its_blocks_beside_the_others() -> None:
    r = report(CacheDesign("block", 16), (96, 100, 100))
    assert r.efficiency == 1.0 and r.reuse_totals()["block"] == (96, 96)
    assert any(line.endswith("blocks of 16 100.0% (96 of 96); judged against the block "
                             "reference (blocks of 16)") for line in r.lines())  # fmt: skip


def test_workers_merge_their_reference_and_configurations_that_differ_say_so() -> None:
    total = Report()
    total.merge(report(CacheDesign("snapshot"), (40, 100, 40)), "gw0")
    total.merge(report(CacheDesign("snapshot"), (10, 10, 10)), "gw1")
    assert (total.reference, total.efficiency, total.snapshot_tokens) == ("snapshot", 1.0, 50)
    total.merge(report(CacheDesign(), (10, 20, 0)))
    assert total.reference == "per configuration"
    assert total.efficiency == 60 / 130  # the token oracle's, named as such
    assert "cache efficiency vs the token oracle (the configurations declare different " \
        "designs): 46.2% (60 of 130 reusable tokens)" in total.lines()  # fmt: skip


def test_the_html_table_marks_the_declared_reference() -> None:
    page = render_html(report(CacheDesign("snapshot"), (40, 100, 40)))
    rows = re.findall(r'<tr( class="judged")? data-reference="(\w+)">(.*?)</tr>', page)
    assert [(judged != "", ref) for judged, ref, _ in rows] == [
        (False, "token"),
        (True, "snapshot"),
    ]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for _, _, row in rows]
    assert [c[2:] for c in cells] == [["100", "40", "40.0%"], ["40", "40", "100.0%"]]
    assert "Snapshot-aware (judged)" in page
    assert "40 of 40 reusable tokens, vs the snapshot-aware reference" in page
    blocks = render_html(report(CacheDesign("block", 16), (96, 100, 100)))
    assert 'data-reference="block"' in blocks and "(16 tokens)" in blocks
