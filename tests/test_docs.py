"""The README and docs/: no machine's paths, no dead relative links or anchors, and the
quickstart that .ci/run executes.

A machine path is an absolute path whose first component is where a machine keeps its own
files: homes (``/home``, ``/root``, ``/Users``), scratch and temp (``/tmp``, ``/var/tmp``,
``/var/folders``, ``/private``), mounts (``/mnt``, ``/Volumes``) and this project's checkouts
(``/work``). It counts only where a path can start: at the start of a line, after whitespace
or one of ``` ` ( " ' = : , [ < ```, so URL paths (``https://host/home``), API endpoints
(``POST /v1/cache/reset``), relative paths (``fixtures/tmp``), ``$TMPDIR/mlx`` and
``{home}/tmp`` do not; system programs (``/usr/bin/chromium``) are not a machine's files.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

MACHINE_PATH = re.compile(
    r"(?:^|(?<=[\s`(\"'=:,\[<]))"
    r"/(?:home|root|Users|work|tmp|var/tmp|var/folders|private|mnt|Volumes)(?=/|\b)"
    r"[^\s`)\"'<>]*",
    re.MULTILINE,
)
FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1[^\S\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_REF = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)=["']([^"']+)["']""", re.IGNORECASE)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)


def documents(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def machine_paths(text: str) -> list[tuple[int, str]]:
    """(line, path) of every machine path in ``text``, code blocks included."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in MACHINE_PATH.finditer(text)]


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code, line numbers kept."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    return INLINE_CODE.sub(blank, FENCE.sub(blank, text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation but ``-`` and
    ``_`` removed, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    kept = "".join(
        c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM"
    )  # letters, numbers, marks
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (a repeated heading gets ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    out = set()
    text = FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), path.read_text(encoding="utf-8"))
    for m in HEADING.finditer(text):
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def dead_links(path: Path, root: Path = ROOT) -> list[str]:
    """Every relative link or image of ``path`` whose file, or heading anchor, is missing."""
    text = prose(path.read_text(encoding="utf-8"))
    problems = []
    for pattern in (LINK, HTML_REF):
        for m in pattern.finditer(text):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, mailto:, ...
                continue
            line = text.count("\n", 0, m.start()) + 1
            where = f"{path.relative_to(root)}:{line}: {target}"
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else (path.parent / file_part).resolve()
            if not dest.exists():
                problems.append(f"{where}: no such file")
            elif not dest.is_relative_to(root.resolve()):
                problems.append(f"{where}: outside the repository")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: no heading #{anchor} in {dest.relative_to(root)}")
    return problems


# --- machine paths -----------------------------------------------------------------------


def test_no_machine_paths_in_the_readme_or_docs() -> None:
    found = [
        f"{doc.relative_to(ROOT)}:{line}: {p}"
        for doc in documents()
        for line, p in machine_paths(doc.read_text(encoding="utf-8"))
    ]
    assert not found, "absolute paths of a development machine:\n" + "\n".join(found)


def test_machine_paths_are_found_and_nothing_else() -> None:
    """Negative control: a development machine's paths are found; URLs, endpoints, relative
    paths and placeholders are not."""
    bad = (
        "SEED_DIR=/work/main/.engines/seed PYTHON=/work/main/.venv/bin/python\n"
        "git worktree add /tmp/before b9df58e\n"
        "PYTHONPATH=/tmp/before .venv/bin/python\n"
        "see (/home/alice/notes.md) and `/Users/bob/model`\n"
        "/root/.cache/huggingface\n"
        "in /private/var/folders/xy/T/prefixcache-tap\n"
    )
    assert [p for _, p in machine_paths(bad)] == [
        "/work/main/.engines/seed",
        "/work/main/.venv/bin/python",
        "/tmp/before",
        "/tmp/before",
        "/home/alice/notes.md",
        "/Users/bob/model",
        "/root/.cache/huggingface",
        "/private/var/folders/xy/T/prefixcache-tap",
    ]
    fine = (
        "pip install 'x @ git+https://github.com/OWNER/home/pytest-prefixcache.git'\n"
        "POST /v1/cache/reset, GET /health, POST /reset_prefix_cache, /workers/1\n"
        "fixtures/corpus/tmp/x.json and ../tmp/y, $TMPDIR/mlx/<version>/, ~/.cache\n"
        "TMPDIR={home}/tmp, $SEED_DIR/tmp, Chromium (/usr/bin/chromium)\n"
    )
    assert machine_paths(fine) == []


# --- links ---------------------------------------------------------------------------------


def test_every_relative_link_and_anchor_exists() -> None:
    problems = [p for doc in documents() for p in dead_links(doc)]
    assert not problems, "dead links:\n" + "\n".join(problems)


def test_dead_links_and_anchors_are_found(tmp_path: Path) -> None:
    """Negative control: a missing file, a missing anchor (here and in another file) and a
    path out of the repository are reported; links that resolve, URLs and links in code are
    not."""
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "other.md").write_text("# Other\n\n## The `prefixcache` command\n")
    (repo / "results").mkdir()
    (tmp_path / "elsewhere.md").write_text("")
    doc = repo / "docs" / "page.md"
    doc.write_text(
        "# Page: one, two\n\n"
        "[ok](other.md#the-prefixcache-command) [ok](#page-one-two) [dir](../results/)\n"
        "[url](https://example.com/missing) ![img](../results/) `[code](missing.md)`\n"
        "```sh\n[fenced](missing.md)\n# not a heading\n```\n"
        "[gone](missing.md) [anchor](other.md#nowhere) [here](#not-a-heading)\n"
        '[out](../../elsewhere.md) <img src="gone.png">\n'
    )
    assert [p.split(": ", 1)[1] for p in dead_links(doc, repo)] == [
        "missing.md: no such file",
        "other.md#nowhere: no heading #nowhere in docs/other.md",
        "#not-a-heading: no heading #not-a-heading in docs/page.md",
        "../../elsewhere.md: outside the repository",
        "gone.png: no such file",
    ]


def test_slugs_follow_github() -> None:
    assert slug("The `prefixcache` command") == "the-prefixcache-command"
    assert slug("llama.cpp's llama-server") == "llamacpps-llama-server"
    assert slug("Claims: what a server reports, and why") == "claims-what-a-server-reports-and-why"
    assert slug("Many cores: pytest-xdist") == "many-cores-pytest-xdist"
    assert slug("The seed engines (vllm-mlx, rapid-mlx)") == "the-seed-engines-vllm-mlx-rapid-mlx"


# --- what the README must keep ----------------------------------------------------------------


def test_the_test_command_is_two_lines_after_its_marker() -> None:
    """.ci/run runs the line two lines after ``<!-- test-command -->`` (awk: getline twice):
    that line must be the quickstart's second command, alone in a sh block."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines.count("<!-- test-command -->") == 1
    i = lines.index("<!-- test-command -->")
    assert lines[i + 1 : i + 4] == [
        "```sh",
        'python3 -m venv .venv && .venv/bin/pip install -e ".[mlx,dev]" && HF_HUB_OFFLINE=1 '
        ".venv/bin/pytest -n 2 --durations=30",
        "```",
    ]
    assert "getline; getline; print" in (ROOT / ".ci" / "run").read_text()
    verify = (
        'python3 -m venv .venv && .venv/bin/pip install -e ".[mlx]" && HF_HUB_OFFLINE=1 '
        ".venv/bin/pytest --prefixcache-verify --pyargs pytest_prefixcache.suite "
        "--prefixcache-html=prefixcache-report.html"
    )
    assert verify in lines[:i], "the first quickstart command, before the test command"


def test_the_docs_show_the_property_test_that_is_run() -> None:
    """The property test tests/test_plugin_fixtures.py runs is the one docs/adapters.md shows."""
    from test_plugin_fixtures import README_TEST

    assert README_TEST.strip() in (ROOT / "docs" / "adapters.md").read_text(encoding="utf-8")
