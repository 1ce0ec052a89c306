"""docs/engines.md's generated table (engines/engines_page.py): fresh against every
``engines/*/runs.toml``, every linked strict xfail and counterexample exists, and the loader
refuses entries it cannot render. No engine is needed."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import engines_page  # noqa: E402
from engines_page import DOC, ROOT, RunsError, load, main, page, render  # noqa: E402


def test_the_page_is_fresh() -> None:
    assert page(DOC.read_text(encoding="utf-8"), load()) == DOC.read_text(encoding="utf-8"), (
        "docs/engines.md is stale: run python engines/engines_page.py"
    )


def test_check_fails_on_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "engines.md"
    stale.write_text(DOC.read_text(encoding="utf-8").replace("[llama-server]", "[llama-srv]", 1))
    monkeypatch.setattr(engines_page, "DOC", stale)
    assert main(["--check"]) == 1  # negative control: one edited cell is caught
    monkeypatch.setattr(engines_page, "DOC", DOC)
    assert main(["--check"]) == 0


#: Issue #37's bound: the page is a table one reads, not a notebook (narratives: NOTES.md).
PAGE_LINES = 150


def _too_long(text: str) -> str:
    lines = text.count("\n") + 1
    if lines <= PAGE_LINES:
        return ""
    return (
        f"docs/engines.md is {lines} lines (at most {PAGE_LINES}): move prose to the engine's "
        "engines/<name>/NOTES.md and merge rows of one engine and mode in its runs.toml"
    )


def test_the_page_stays_a_page() -> None:
    assert not _too_long(DOC.read_text(encoding="utf-8"))


def test_a_long_page_is_caught() -> None:
    long = DOC.read_text(encoding="utf-8") + "more prose\n" * PAGE_LINES
    assert "at most 150" in _too_long(long)  # negative control


def _defined(test_file: Path, name: str) -> bool:
    base = name.split("[", 1)[0]
    return re.search(rf"^def {re.escape(base)}\(", test_file.read_text(), re.M) is not None


def test_every_xfail_counterexample_and_notes_exists() -> None:
    runs = load()
    assert runs, "no engines/*/runs.toml entries"
    for run in runs:
        assert (ROOT / "engines" / run.folder / "NOTES.md").is_file(), run
        if run.xfail:
            test_file, _, name = run.xfail.partition("::")
            assert (ROOT / test_file).is_file() and _defined(ROOT / test_file, name), run.xfail
        if run.counterexample:
            assert (ROOT / run.counterexample).is_file(), run.counterexample


def test_a_missing_xfail_is_caught() -> None:
    assert not _defined(ROOT / "engines/llama/test_llama_server.py", "test_no_such_test")


def _write(tmp_path: Path, body: str) -> Path:
    folder = tmp_path / "engines" / "x"
    folder.mkdir(parents=True)
    (folder / "runs.toml").write_text(body)
    return tmp_path


ENTRY = """[[run]]
engine = "e"
version = "1"
mode = "m"
model = "llama"
verdict = "PASS"
result = "ok"
finding = "none"
command = "run.sh"
"""


def test_a_good_entry_renders_with_its_notes_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engines_page, "ROOT", tmp_path)
    runs = load(_write(tmp_path, ENTRY))
    assert "[e](../engines/x/NOTES.md) 1 | m | llama | PASS | ok | none | `run.sh` |" in render(
        runs
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('verdict = "PASS"', 'verdict = "pass"'), "verdict 'pass' is not one of"),
        (('result = "ok"', 'result = "' + "x" * 121 + '"'), "result is 121 characters"),
        (('model = "llama"', 'modle = "llama"'), "unknown field(s) ['modle']"),
        (
            (
                'verdict = "PASS"\nresult = "ok"\nfinding = "none"',
                'verdict = "FAIL"\nresult = "ok"\nfinding = "bug"',
            ),
            "names its strict xfail",
        ),
    ],
)
def test_bad_entries_are_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: tuple[str, str], message: str
) -> None:
    monkeypatch.setattr(engines_page, "ROOT", tmp_path)
    root = _write(tmp_path, ENTRY.replace(*edit))
    with pytest.raises(RunsError, match=re.escape(message)) as info:
        load(root)
    assert "engines/x/runs.toml: run 1" in str(info.value)


def _dead_links(notes: Path) -> list[str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_docs import slug  # the docs tests' GitHub anchor rule

    dead = []
    for target in re.findall(r"\]\(([^)\s]+)\)", notes.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        file = (notes.parent / path).resolve() if path else notes.resolve()
        if not file.exists():
            dead.append(f"{notes}: {target}: no such file")
        elif anchor and file.suffix == ".md":
            lines = file.read_text(encoding="utf-8").splitlines()
            if anchor not in {
                slug(line.lstrip("#").strip()) for line in lines if line.startswith("#")
            }:
                dead.append(f"{notes}: {target}: no such heading")
    return dead


def test_the_engines_notes_have_no_dead_links() -> None:
    dead = [d for notes in sorted(ROOT.glob("engines/*/NOTES.md")) for d in _dead_links(notes)]
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_a_dead_notes_link_is_caught(tmp_path: Path) -> None:
    bad = tmp_path / "NOTES.md"
    bad.write_text("# Here\n[x](no-such-file.md) [y](NOTES.md#no-such-heading) [z](#here)\n")
    assert len(_dead_links(bad)) == 2  # negative control: both dead links, not the live one
