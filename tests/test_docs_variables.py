"""Every ``PREFIXCACHE_*`` variable the code reads is documented (issue 25, item 2): in the
README's tables or docs/adapters.md's (a server's user finds what they can set on the page the
README links, not in a docstring), or in a document of docs/ for a tool of its own."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"\bPREFIXCACHE_[A-Z0-9_]*[A-Z0-9]\b")


def undocumented(sources: dict[str, str], readme: str) -> dict[str, str]:
    """Variable -> the first file naming it, for every variable the README does not name
    (in backticks, as its tables do)."""
    out: dict[str, str] = {}
    for path, text in sorted(sources.items()):
        for name in NAME.findall(text):
            if f"`{name}`" not in readme:
                out.setdefault(name, path)
    return out


def _sources() -> dict[str, str]:
    files = [ROOT / "conftest.py"]
    for package in ("pytest_prefixcache", "reference_engine"):
        files += sorted((ROOT / package).rglob("*.py"))
    return {str(f.relative_to(ROOT)): f.read_text(encoding="utf-8") for f in files}


def test_every_variable_the_code_reads_is_documented() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    docs = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    sources = _sources()
    assert len(sources) > 50 and "pytest_prefixcache/adapters/presets/server.py" in sources
    missing = undocumented(sources, readme + docs)
    assert not missing, f"add these to the README's PREFIXCACHE_* tables: {missing}"
    adapters = (ROOT / "docs" / "adapters.md").read_text(encoding="utf-8")
    server = {k: v for k, v in undocumented(sources, adapters).items() if "adapters/" in v}
    assert not server, f"a server's variables belong in docs/adapters.md's tables: {server}"
    assert "docs/adapters.md#every-variable-the-adapters-read" in readme  # the README links them
    assert "`PREFIXCACHE_CHECK_LABELS`" in adapters  # the one issue 25 found in a docstring only


def test_an_undocumented_variable_is_reported() -> None:
    """Negative control: a name the README lacks is caught, with its file; a documented one
    and a bare prefix are not."""
    readme = "| `PREFIXCACHE_MODEL` | the model |"
    sources = {
        "pkg/a.py": 'os.environ.get("PREFIXCACHE_MODEL")\nos.environ["PREFIXCACHE_NEW_KNOB"]\n',
        "pkg/b.py": "PREFIXCACHE_NEW_KNOB = 1  # also here\nprefix = 'PREFIXCACHE_'\n",
    }
    assert undocumented(sources, readme) == {"PREFIXCACHE_NEW_KNOB": "pkg/a.py"}
