"""docs/benchmarks.md's generated tables (benchmarks/benchmarks_page.py): each block is what its
JSON in benchmarks/results/ renders, and a page with a block no renderer knows is refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import benchmarks_page  # noqa: E402
from benchmarks_page import DOC, RENDERERS, PageError, main, page  # noqa: E402


def test_the_page_is_fresh() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert page(text) == text, (
        "docs/benchmarks.md is stale: run python benchmarks/benchmarks_page.py"
    )


def test_every_renderer_has_its_block_once() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name in RENDERERS:
        assert text.count(f"<!-- bench:{name} -->") == 1, name


def test_check_fails_on_an_edited_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: one figure edited by hand inside a block is caught, and put back."""
    text = DOC.read_text(encoding="utf-8")
    edited = text.replace(
        "| tiny | agentic_loop | reference | ", "| tiny | agentic_loop | reference | 1", 1
    )
    assert edited != text
    stale = tmp_path / "benchmarks.md"
    stale.write_text(edited, encoding="utf-8")
    monkeypatch.setattr(benchmarks_page, "DOC", stale)
    assert main(["--check"]) == 1
    assert main([]) == 0 and stale.read_text(encoding="utf-8") == text
    assert main(["--check"]) == 0


def test_an_unknown_or_missing_block_is_refused() -> None:
    text = DOC.read_text(encoding="utf-8")
    with pytest.raises(PageError, match=r"without a renderer \['nosuch'\]"):
        page(text + "\n<!-- bench:nosuch -->\nx\n<!-- /bench:nosuch -->\n")
    with pytest.raises(PageError, match=r"renderers without a block \['prefill'\]"):
        page(text.replace("<!-- bench:prefill -->", "").replace("<!-- /bench:prefill -->", ""))
