"""The self-contained HTML report: unit tests on the rendered page, and the sample report of a
run against a buggy engine opened in a real headless Chromium.

The sample (``tests/html_report_sample/``) is the JSON report of a run against
``reference_engine.mutants:placeholder_collision`` with its four saved failing streams.
"""

from __future__ import annotations

import ast
import base64
import json
import math
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from pytest_prefixcache.html import render_html, write_html
from pytest_prefixcache.html.charts import MAX_BARS, MAX_DECADES, diff_bins
from pytest_prefixcache.output.report import FailureRecord, Report, RequestRecord

SAMPLE = Path(__file__).parent / "html_report_sample"
PACKAGE = Path(__file__).parent.parent / "pytest_prefixcache" / "html"
CHROMIUM = os.environ.get("PREFIXCACHE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PNG_1x1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


class _Elements(HTMLParser):
    """Every start tag as ``(tag, attrs, ids of the enclosing elements)``."""

    VOID = frozenset({"img", "meta", "br", "hr", "input", "link"})

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str], tuple[str, ...]]] = []
        self.stack: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.found.append((tag, a, tuple(i for _, i in self.stack if i)))
        if tag not in self.VOID:
            self.stack.append((tag, a.get("id", "")))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        ids = tuple(i for _, i in self.stack if i)
        self.found.append((tag, {k: v or "" for k, v in attrs}, ids))

    def handle_endtag(self, tag: str) -> None:
        if any(t == tag for t, _ in self.stack):
            while self.stack.pop()[0] != tag:
                pass


def select(page: str, tag: str, cls: str = "", inside: str = "") -> list[dict[str, str]]:
    """Attributes of every ``tag`` whose class list holds all of ``cls`` (within id ``inside``)."""
    parser = _Elements()
    parser.feed(page)
    want = set(cls.split())
    return [
        a
        for t, a, ids in parser.found
        if t == tag and want <= set(a.get("class", "").split()) and (not inside or inside in ids)
    ]


def record(i: int, cached: int | None, reusable: int | None, diff: float = 0.0) -> RequestRecord:
    return RequestRecord(
        stream=i // 3,
        request=i % 3,
        prompt_tokens=300,
        cached_tokens=cached,
        reusable=reusable,
        diff=diff,
        kl=0.0,
        warm_seconds=0.01,
        cold_seconds=0.02,
        images=1,
    )


def report_with(
    records: list[RequestRecord], failures: list[FailureRecord] | None = None
) -> Report:
    return Report(
        seed=7,
        engine="my_engine:build",
        requests=len(records),
        streams=3,
        cache_hits=sum(1 for r in records if r.cached_tokens),
        reused_tokens=100,
        oracle_tokens=120,
        warm_seconds=0.5,
        cold_seconds=1.0,
        records=list(records),
        failures=list(failures or []),
    )


def save_stream_dir(directory: Path, messages: list[dict[str, Any]], images: list[str]) -> Path:
    directory.mkdir(parents=True)
    for name in images:
        (directory / name).write_bytes(PNG_1x1)
    stream = {
        "format": "pytest-prefixcache/stream/v1",
        "description": "",
        "requests": [
            {"namespace": "", "max_new_tokens": 0, "messages": messages[:1]},
            {"namespace": "", "max_new_tokens": 0, "messages": messages},
        ],
    }
    (directory / "stream.json").write_text(json.dumps(stream), encoding="utf-8")
    return directory


def failure(stream_dir: Path | str | None, **kw: Any) -> FailureRecord:
    values: dict[str, Any] = {
        "check": "equivalence",
        "test": "verification.py::test_request_streams",
        "summary": "equivalence: logits differ",
        "replay": "pytest --prefixcache-verify --prefixcache-replay=x/stream.json",
        "message": "equivalence: logits differ\n  at request 1",
        "stream_dir": None if stream_dir is None else str(stream_dir),
        "request_index": 1,
    }
    return FailureRecord(**{**values, **kw})


@pytest.fixture
def sample(tmp_path: Path) -> Report:
    """The sample report, its failure directories copied to ``tmp_path`` and its stream_dir
    paths rewritten to point there."""
    shutil.copytree(SAMPLE / "failures", tmp_path / "failures")
    report = Report.read_json(SAMPLE / "report.json")
    report.failures = [
        FailureRecord(**{**f.__dict__, "stream_dir": str(tmp_path / (f.stream_dir or "?"))})
        for f in report.failures
    ]
    return report


def test_reuse_chart_draws_one_bar_per_request_and_flags_reuse_above_the_oracle() -> None:
    records = [
        record(0, 0, 0),
        record(1, 120, 120),
        record(2, 256, 239),  # reported more than the oracle allows
        record(3, 16, 64),
        record(4, None, 50),  # the engine reported nothing
        record(5, 30, None),  # no token ids: no oracle
        record(6, 200, 100),
    ]
    page = render_html(report_with(records))
    [svg] = select(page, "svg", inside="reuse")
    assert svg["id"] == "chart-reuse" and svg["data-bars"] == "7" and svg["data-over"] == "2"
    assert len(select(page, "rect", "bar reported", inside="chart-reuse")) == 6
    assert len(select(page, "rect", "bar oracle", inside="chart-reuse")) == 6
    over = select(page, "rect", "bar reported over", inside="chart-reuse")
    assert len(over) == 2
    assert len(select(page, "path", "over-marker", inside="chart-reuse")) == 2
    # heights are to scale: 256 and 239 on the same axis
    reported = select(page, "rect", "bar reported", inside="chart-reuse")
    heights = [float(a["height"]) for a in reported]
    assert heights[0] == 0 and heights[2] > heights[1] > heights[3] > 0
    assert "stream 0, request 2: reported 256 cached, oracle maximum 239" in page
    # axes and legend
    assert {"x-axis", "y-axis"} <= {
        c for a in select(page, "g", inside="chart-reuse") for c in a.get("class", "").split()
    }
    assert "oracle maximum" in page and "reported &gt; oracle" in page


def test_reuse_chart_groups_very_long_runs() -> None:
    records = [record(i, 10, 10 if i != 1234 else 5) for i in range(3 * MAX_BARS + 1)]
    page = render_html(report_with(records))
    [svg] = select(page, "svg", inside="reuse")
    assert svg["data-group"] == "4" and svg["data-requests"] == str(len(records))
    bars = select(page, "rect", "bar reported", inside="chart-reuse")
    assert len(bars) == math.ceil(len(records) / 4) <= MAX_BARS
    assert len(select(page, "rect", "bar over", inside="chart-reuse")) == 1
    assert "each bar is the maximum of a group" in page


def test_diff_histogram_has_a_bar_for_zero_and_one_per_decade() -> None:
    diffs = [0.0, 0.0, 0.0, 1e-7, 5e-7, 0.3, 2.0, math.nan]
    page = render_html(report_with([record(i, 0, 0, d) for i, d in enumerate(diffs)]))
    bins = select(page, "rect", "bin", inside="chart-diff")
    # exactly 0, then 1e-7 .. 1e0 (8 decades), then NaN/inf
    assert [b["data-count"] for b in bins] == ["3", "2", "0", "0", "0", "0", "0", "1", "1", "1"]
    assert "zero" in bins[0]["class"] and "nonfinite" in bins[-1]["class"]
    assert all("over-tol" in b["class"] for b in bins[1:-1])  # exact tolerance: all fail
    xs = [float(b["x"]) for b in bins]
    assert xs == sorted(xs)
    assert "10⁻⁷" in page and "NaN/inf" in page
    assert select(page, "g", "x-axis", inside="chart-diff")
    assert select(page, "g", "y-axis", inside="chart-diff")


def test_diff_bins_keep_at_most_max_decades_and_mark_atol() -> None:
    bins = diff_bins([1e-30, 1.0, 0.0])
    assert len(bins) == 1 + MAX_DECADES
    assert bins[1].lo == 0 and bins[1].count == 1 and bins[-1].count == 1
    assert sum(b.count for b in bins) == 3
    records = [record(i, 0, 0, d) for i, d in enumerate([1e-6, 1e-3, 0.5])]
    page = render_html(Report(tolerance="atol=0.01, rtol=0", records=records, requests=3))
    assert select(page, "line", "tol-line", inside="chart-diff")
    rects = select(page, "rect", "bin", inside="chart-diff")
    kinds = [b["class"].split()[1] for b in rects]
    assert kinds == ["zero", "pos", "pos", "pos", "pos", "over-tol", "over-tol"]  # 1e-6 .. 1
    # with a relative tolerance nothing above 0 is a certain failure
    page = render_html(Report(tolerance="atol=0.01, rtol=0.1", records=records, requests=3))
    assert not select(page, "rect", "over-tol", inside="chart-diff")


def test_everything_is_escaped(tmp_path: Path) -> None:
    script = "<script>alert('x')</script>"
    directory = save_stream_dir(
        tmp_path / "s",
        [{"role": "user", "content": [f"hello {script} & <img src=x onerror=alert(1)>"]}],
        [],
    )
    report = report_with(
        [record(0, 1, 1)],
        [
            failure(
                directory,
                test=f"test_x[{script}]",
                summary=f"summary {script}",
                message=f"message {script}",
                replay=f"pytest -k '{script}'",
                check="<b>check</b>",
            )
        ],
    )
    report.engine = f"evil{script}"
    report.worst_diff_where = script
    page = render_html(report)
    assert "<script" not in page.lower() and "<img src=x" not in page
    assert page.count("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;") >= 7
    assert "&lt;b&gt;check&lt;/b&gt;" in page and "&amp; &lt;img src=x" in page
    assert len(select(page, "pre", "message")) == 1


def test_the_page_is_self_contained(sample: Report) -> None:
    page = render_html(sample)
    assert not re.search(r"<script|<link|@import|url\(|src=\"(?!data:)", page, re.I)
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)
    assert all(a["src"].startswith("data:image/") for a in select(page, "img"))


def test_failures_are_shown_with_their_stream_and_images_inline(sample: Report) -> None:
    page = render_html(sample)
    sections = select(page, "section", "failure")
    assert [s["id"] for s in sections] == [f"failure-{i}" for i in range(1, 5)]
    assert "FAIL: 4 failures" in page
    expected = 0
    for i, f in enumerate(sample.failures, 1):
        assert f.replay and f.stream_dir
        stream = json.loads((Path(f.stream_dir) / "stream.json").read_text())
        parts = [
            p["image"]
            for r in stream["requests"]
            for m in r["messages"]
            for p in m["content"]
            if isinstance(p, dict)
        ]
        expected += len(parts)
        imgs = select(page, "img", "failure-image", inside=f"failure-{i}")
        assert len(imgs) == len(parts)
        # and a thumbnail of each in its request's one-line summary
        assert len(select(page, "img", "thumb", inside=f"failure-{i}")) == len(parts)
        for img, name in zip(imgs, parts):
            assert img["alt"] == name
            data = base64.b64decode(img["src"].removeprefix("data:image/png;base64,"))
            assert data == (Path(f.stream_dir) / name).read_bytes()
        [failing] = select(page, "details", "request failing", inside=f"failure-{i}")
        assert failing["data-request"] == str(f.request_index) and "open" in failing
        assert len(select(page, "details", "request", inside=f"failure-{i}")) == len(
            stream["requests"]
        )
    assert len(select(page, "img", "failure-image")) == expected
    assert len(select(page, "pre", "message")) == 4 and len(select(page, "pre", "replay")) == 4
    assert "omlx_image_edit_a_to_e" in page and "make the sky bluer" in page


def test_a_moved_report_finds_its_failures_next_to_it(tmp_path: Path) -> None:
    """The sample as written: relative stream_dirs; and absolute ones from another machine."""
    report = Report.read_json(SAMPLE / "report.json")
    relative = render_html(report, base_dir=SAMPLE)
    elsewhere = tmp_path / "ci-machine" / ".prefixcache"
    report.failures = [
        FailureRecord(**{**f.__dict__, "stream_dir": str(elsewhere / (f.stream_dir or "?"))})
        for f in report.failures
    ]
    moved = tmp_path / "artifact"
    shutil.copytree(SAMPLE / "failures", moved / ".prefixcache" / "failures")
    absolute = render_html(report, base_dir=moved)
    out_dir = tmp_path / "prefixcache-report"  # the layout of prefixcache verify --out
    shutil.copytree(SAMPLE / "failures", out_dir / "failures")
    for page in (relative, absolute, render_html(report, base_dir=out_dir)):
        assert len(select(page, "img", "failure-image")) == 34
        assert not select(page, "p", "missing-stream")
        assert not select(page, "div", "missing-image")
    assert "missing-stream" in render_html(report)  # without base_dir: not found, said so


def test_a_passing_report_says_so() -> None:
    page = render_html(report_with([record(i, 10, 10) for i in range(6)]))
    [verdict] = select(page, "div", "verdict")
    assert "pass" in verdict["class"].split()
    assert ">PASS<" in page and 'id="no-failures"' in page
    assert not select(page, "section", "failure")
    assert "reported &gt; oracle" in page and select(page, "div", "stat good")


def test_missing_streams_and_images_are_noted_not_raised(tmp_path: Path) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": ["first", {"image": "img-a.png"}]},
        {"role": "assistant", "content": ["ok"]},
        {"role": "user", "content": [{"image": "img-b.png"}, {"image": "../outside.png"}]},
    ]
    partial = save_stream_dir(tmp_path / "partial", messages, ["img-a.png", "img-b.png"])
    (partial / "img-b.png").unlink()
    (tmp_path / "outside.png").write_bytes(PNG_1x1)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "stream.json").write_text("{not json", encoding="utf-8")
    report = report_with(
        [record(0, 1, 1)],
        [
            failure(partial),
            failure(tmp_path / "nowhere"),
            failure(None, request_index=None),
            failure(broken),
            failure(partial, request_index=9),
        ],
    )
    page = render_html(report)
    assert len(select(page, "section", "failure")) == 5
    images = select(page, "img", "failure-image", inside="failure-1")
    assert [a["alt"] for a in images] == ["img-a.png", "img-a.png"]  # in requests 0 and 1
    notes = select(page, "div", "missing-image", inside="failure-1")
    assert len(notes) == 2
    assert "img-b.png" in page and "is missing from" in page
    assert "outside the stream" in page and "outside.png&#x27; is missing" not in page
    assert select(page, "p", "missing-stream", inside="failure-2")
    assert "nowhere" in page
    assert select(page, "p", "missing-stream", inside="failure-3")
    assert "No stream was saved" in page
    assert select(page, "p", "missing-stream", inside="failure-4")
    assert "index 9 is not in this stream" in page


def test_images_given_as_a_spec_are_drawn(tmp_path: Path) -> None:
    directory = tmp_path / "spec"
    directory.mkdir()
    stream = {
        "format": "pytest-prefixcache/stream/v1",
        "images": {"red": {"pattern": "solid", "width": 8, "height": 6, "color": [255, 0, 0]}},
        "requests": [{"messages": [{"role": "user", "content": [{"image": "red"}, "hi"]}]}],
    }
    (directory / "stream.json").write_text(json.dumps(stream), encoding="utf-8")
    page = render_html(report_with([], [failure(directory, request_index=0)]))
    [img] = select(page, "img", "failure-image")
    assert img["src"].startswith("data:image/png;base64,") and img["width"] == "8"


def test_an_empty_report_renders(tmp_path: Path) -> None:
    for report in (Report(), Report.from_json({"requests": 0})):
        page = render_html(report)
        assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
        assert "NOTHING VERIFIED" in page
        for chart in ("chart-reuse", "chart-diff"):
            assert select(page, "svg", "chart", inside="") and f'id="{chart}"' in page
        assert not select(page, "rect", "bar")
        assert page.count("no per-request records") == 2
    error = Report(engine_error="ImportError: no module named 'x'")
    assert "ERROR: the engine could not be built" in render_html(error)


def test_write_html_creates_the_directory(tmp_path: Path, sample: Report) -> None:
    out = write_html(sample, tmp_path / "out" / "report.html")
    assert out == tmp_path / "out" / "report.html"
    assert out.read_text(encoding="utf-8") == render_html(sample)


def test_the_package_imports_only_the_standard_library() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    for module in PACKAGE.glob("*.py"):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only: ..images is imported lazily
            if isinstance(node, ast.Import):
                assert {a.name.split(".")[0] for a in node.names} <= allowed, module
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                assert (node.module or "").split(".")[0] in allowed, module
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 1 or node.module in ("output.report", "output.summary"), (
                    module,
                    node.module,
                )
        assert len(module.read_text(encoding="utf-8").splitlines()) <= 300, module
    code = "import sys, pytest_prefixcache.html; print('mlx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _playwright() -> Any:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; no browser download)")
    return sync_playwright


@pytest.mark.slow
def test_the_sample_report_in_headless_chromium(tmp_path: Path, sample: Report) -> None:
    """Open the page in a real browser: charts laid out, every image decoded, the failures
    visible, nothing fetched from anywhere, and a screenshot that is not blank."""
    sync_playwright = _playwright()
    page_file = write_html(sample, tmp_path / "report.html")
    profile = tmp_path / "chromium-home"  # Chromium's and fontconfig's caches, not ~/.cache
    env = {**os.environ, "HOME": str(profile), "XDG_CACHE_HOME": str(profile / "cache"),
           "XDG_CONFIG_HOME": str(profile / "config")}  # fmt: skip
    requests: list[str] = []
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, env=env, timeout=120_000
        )
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(page_file.as_uri(), wait_until="load", timeout=60_000)

            assert page.title().startswith("FAIL: 4 failures")
            for chart in ("#chart-reuse", "#chart-diff"):
                box = page.locator(chart).bounding_box()
                assert box is not None and box["width"] > 300 and box["height"] > 100, chart
            bars = page.locator("#chart-reuse rect.bar.reported")
            assert bars.count() == len(sample.records) == 898
            assert page.locator("#chart-reuse rect.bar.over").count() == 60
            assert page.locator("#chart-diff rect.bin").count() >= 2

            failures = page.locator("section.failure")
            assert failures.count() == 4
            for i in range(4):
                section = failures.nth(i)
                assert section.is_visible()
                assert section.locator("pre.message").is_visible()
                assert section.locator("pre.replay").is_visible()
                failing = section.locator("details.request.failing")
                assert failing.is_visible() and failing.get_attribute("open") is not None
                shown = failing.locator("img.failure-image")
                assert shown.count() >= 1
                for j in range(shown.count()):
                    assert shown.nth(j).is_visible()

            sizes = page.eval_on_selector_all(
                "img.failure-image", "imgs => imgs.map(i => [i.complete, i.naturalWidth])"
            )
            assert len(sizes) == 34
            assert all(complete and width > 0 for complete, width in sizes), sizes

            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert not problems, problems
    assert all(u.startswith(("file:", "data:")) for u in requests), requests

    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    from PIL import Image

    with Image.open(shot) as im:
        width, height = im.size
        assert width == 1200 and height > 2000  # the whole page, failures included
        colours = im.convert("RGB").resize((300, height // 4)).getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50  # text, bars, images: far from blank
