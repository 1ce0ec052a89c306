"""The HTML report shows what the terminal shows: a real verification (the fake engines, a few
examples) prints its summary, and the page rendered from its JSON report has the same verdict,
coverage rows, efficiency findings, skipped tests and summary lines, line for line; a page
with an over-claimed reuse never shows an efficiency figure; and in headless Chromium the
coverage table and the findings are on screen."""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from plugin_support import with_fakes
from test_report_html import CHROMIUM, CHROMIUM_ARGS, _playwright

from pytest_prefixcache.html import render_html, write_html
from pytest_prefixcache.output.report import Report

pytest_plugins = ["pytester"]

ENGINES = """
from fakeengines import FakeEngine


class TextOnly(FakeEngine):
    supports_images = False  # the image scenarios of the corpus are skipped


def wasteful():
    # keeps the volatile header (render-hygiene findings) and half its blocks (low efficiency),
    # and declares a snapshot design: judged against the snapshot-aware reference
    engine = TextOnly(keep_volatile=True, store_half=True)
    engine.reuse_reference = "snapshot"
    return engine


def liar():
    return TextOnly(lie=True)  # reports one block more than it reused: the reuse bound fails
"""

#: options of each run: one that fails with findings, one that over-claims, one that passes,
#: and a matrix of two configurations (the verdict lines hold one row per configuration)
RUNS = {
    "findings": ("--prefixcache-engine=parityengines:wasteful", "--prefixcache-min-efficiency=0.9"),
    "over-claims": ("--prefixcache-engine=parityengines:liar",),
    "pass": ("--prefixcache-engine=parityengines:wasteful",),
    "matrix": (
        "--prefixcache-engine=wasteful=parityengines:wasteful",
        "--prefixcache-engine=liar=parityengines:liar",
    ),
}


class _Lines(HTMLParser):
    """The text of every element of class ``line``, by the id of its section; a table row's
    cells separated by tabs."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, list[str]] = {}
        self.section = ""
        self.depth = 0  # inside a line element: its nesting depth
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "section" and a.get("id"):
            self.section = a["id"]
        if self.depth:
            self.depth += 1
            if tag == "td" and self.text:
                self.text.append("\t")
        elif "line" in a.get("class", "").split():
            self.depth, self.text = 1, []

    def handle_endtag(self, tag: str) -> None:
        if self.depth:
            self.depth -= 1
            if not self.depth:
                self.sections.setdefault(self.section, []).append("".join(self.text))

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.text.append(data)


def html_lines(page: str) -> dict[str, list[str]]:
    parser = _Lines()
    parser.feed(page)
    return parser.sections


#: The terminal lines that start a block of the page other than the summary's lines.
BLOCKS = {
    "efficiency findings": "findings",
    "skipped:": "skipped",
    "coverage (": "coverage",
    "configurations:": "verdict-lines",
    "verdict:": "verdict-lines",
}


def terminal_blocks(stdout: list[str]) -> dict[str, list[str]]:
    """The terminal summary's lines by the page section that shows them (indented lines go
    with the line above; the coverage title is dropped, its rows kept as the page's cells)."""
    start = next(i for i, line in enumerate(stdout) if re.fullmatch(r"=+ prefixcache =+", line))
    end = next(i for i, line in enumerate(stdout) if line.startswith("JSON report written"))
    blocks: dict[str, list[str]] = {}
    key = "summary-lines"
    for line in stdout[start + 1 : end]:
        if not line.startswith("  ") and key != "verdict-lines":  # the verdict's block is last
            key = next((v for k, v in BLOCKS.items() if line.startswith(k)), "summary-lines")
            if key == "coverage":
                continue
        text = coverage_cells(line) if key == "coverage" else line.strip()
        blocks.setdefault(key, []).append(text)
    return blocks


def coverage_cells(line: str) -> str:
    """A terminal coverage row as the page's row text: check, ran/total, why."""
    m = re.fullmatch(r"  (.+?)\s{2,}(\d+/\d+)(?: \((.*)\))?", line)
    assert m, line
    return "\t".join((m[1], m[2], m[3] or ""))


def run(pytester: pytest.Pytester, name: str) -> tuple[list[str], Report, str]:
    """Verify one of :data:`RUNS`: the terminal's lines, the JSON report and the page."""
    with_fakes(pytester)
    pytester.makepyfile(parityengines=ENGINES)
    path = pytester.path / "report.json"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning",
        "--prefixcache-verify", "--prefixcache-examples=5", "--prefixcache-seed=1",
        f"--prefixcache-report={path}", *RUNS[name],
    )  # fmt: skip
    report = Report.read_json(path)
    return result.stdout.lines, report, render_html(report, base_dir=pytester.path)


@pytest.mark.parametrize("name", list(RUNS))
def test_the_page_and_the_terminal_agree_line_for_line(
    pytester: pytest.Pytester, name: str
) -> None:
    stdout, report, page = run(pytester, name)
    term = terminal_blocks(stdout)
    shown = html_lines(page)
    for section in ("verdict-lines", "coverage", "summary-lines", "findings", "skipped"):
        assert shown.get(section, []) == term.get(section, []), section
    assert term["coverage"] and term["skipped"]  # 4 image scenarios: the engine is text-only
    assert set(shown) <= set(BLOCKS.values()) | {"summary-lines"}
    [verdict] = [t for t in term["verdict-lines"] if t.startswith("verdict: ")]
    word = verdict.removeprefix("verdict: ").split()[0]
    assert word == report.verdict.upper() == ("PASS" if name == "pass" else "FAIL")
    badge = re.search(r'<div id="verdict" class="verdict \w+">([^<:]*)', page)
    assert badge and badge[1].split()[0] == word
    if name == "findings":
        assert term["findings"][0].startswith("efficiency findings") and len(term["findings"]) > 1
        assert any(t.startswith("failures by check: min efficiency") for t in term["summary-lines"])
    if name == "matrix":
        assert term["verdict-lines"][0] == "configurations: 2" and len(term["verdict-lines"]) == 4
    if name == "over-claims":
        [line] = [t for t in term["summary-lines"] if t.startswith("cache efficiency vs")]
        assert "not judged" in line and "%" not in line


@pytest.mark.slow
def test_the_comparison_sees_a_page_that_drifts(pytester: pytest.Pytester) -> None:
    """Negative control: a page rendered from a report that lost a finding, a coverage count
    or a skipped test no longer agrees with the terminal."""
    stdout, report, _ = run(pytester, "findings")
    term = terminal_blocks(stdout)
    report.finding_examples = report.finding_examples[:1]
    report.coverage["equivalence"]["applied"] -= 1
    report.skipped.pop()
    shown = html_lines(render_html(report))
    for section in ("findings", "coverage", "skipped"):
        assert shown[section] != term[section], section


def test_a_page_with_over_claims_shows_no_efficiency_figure() -> None:
    """The capped reuse of an engine that over-claims reads 100%: neither the terminal nor the
    page shows it beside the failed reuse bound (negative control: without over-claims the
    same counters show 100.0%)."""
    honest = Report(engine="m:e", requests=2, reused_tokens=64, oracle_tokens=64)
    lying = Report(engine="m:e", requests=2, reused_tokens=64, oracle_tokens=64, over_claims=1)
    for rep, shown in ((honest, True), (lying, False)):
        terminal = "\n".join(rep.lines())
        page = render_html(rep)
        assert ("100.0%" in terminal) is shown and ("100.0%" in page) is shown
        assert ("not judged" in terminal) is not shown and ("not judged" in page) is not shown
    [line] = [t for t in lying.lines() if t.startswith("cache efficiency")]
    assert line.endswith("not judged: 1 request(s) reported more reuse than the token oracle "
                         "allows (reuse bound)")  # fmt: skip
    assert Report.from_json(lying.to_json()).over_claims == 1


@pytest.mark.slow
def test_a_failing_page_in_headless_chromium(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The page of a failing run in a real browser: the verdict, the coverage table, the
    findings and the skipped tests on screen, with the terminal's text; a full-page
    screenshot that is not blank."""
    sync_playwright = _playwright()
    stdout, report, _ = run(pytester, "findings")
    term = terminal_blocks(stdout)
    page_file = write_html(report, tmp_path / "report.html", base_dir=pytester.path)
    profile = tmp_path / "chromium-home"  # Chromium's and fontconfig's caches, not ~/.cache
    env = {**os.environ, "HOME": str(profile), "XDG_CACHE_HOME": str(profile / "cache"),
           "XDG_CONFIG_HOME": str(profile / "config")}  # fmt: skip
    shot = tmp_path / "report.png"
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, env=env, timeout=120_000
        )
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto(page_file.as_uri(), wait_until="load", timeout=60_000)
            assert page.title().startswith("FAIL")
            verdict = page.locator("#verdict-lines li.line")
            assert verdict.first.is_visible() and verdict.first.inner_text() == "verdict: FAIL"
            rows = page.locator("#coverage-table tbody tr")
            assert rows.count() == len(term["coverage"]) > 5
            for i, line in enumerate(term["coverage"]):
                assert rows.nth(i).is_visible()
                cells = rows.nth(i).locator("td").all_inner_texts()
                assert "\t".join(cells) == line
            findings = page.locator("#findings li.line")
            assert findings.count() == len(term["findings"]) > 1
            assert all(findings.nth(i).is_visible() for i in range(findings.count()))
            assert findings.all_inner_texts() == term["findings"]
            skipped = page.locator("#skipped li.line")
            # a header, the four image scenarios, test_waves
            assert skipped.count() == len(term["skipped"]) == 6
            assert skipped.last.is_visible()
            box = page.locator("#coverage-table").bounding_box()
            assert box is not None and box["width"] > 300 and box["height"] > 100
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    from PIL import Image

    with Image.open(shot) as im:
        assert im.size[0] == 1200 and im.size[1] > box["y"] + box["height"]
        region = im.convert("RGB").crop(
            (int(box["x"]), int(box["y"]), int(box["x"] + box["width"]),
             int(box["y"] + box["height"]))
        )  # fmt: skip
        colours = region.getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 10  # the table's text is drawn, not blank
