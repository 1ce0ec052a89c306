"""The adapters' environment variables: one declaration, read through it, documented from it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pytest_prefixcache
from pytest_prefixcache.adapters import environment
from pytest_prefixcache.adapters.environment import VARIABLES, markdown_table, value
from pytest_prefixcache.errors import EngineError

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = Path(pytest_prefixcache.__file__).parent / "adapters"
READERS = {"presets/server.py": "server", "seed.py": "seed", "omlx.py": "omlx"}
NAME = re.compile(r"^(PREFIXCACHE|SEED|OMLX)_[A-Z_]+$")


def test_the_docs_table_is_the_generated_one() -> None:
    page = (ROOT / "docs" / "adapters.md").read_text(encoding="utf-8")
    between = page.split("<!-- environment-table -->\n")[1].split("\n<!-- /environment-table -->")
    assert between[0] == markdown_table(), (
        "docs/adapters.md: paste `python -m pytest_prefixcache.adapters.environment`"
    )


def test_every_default_parses_and_is_documented() -> None:
    for var in VARIABLES:
        default = value(var.name, {})
        if var.default is not None:
            assert default == var.parse(var.default)
            assert f"`{var.default}`" in markdown_table() or var.shown
    assert value("PREFIXCACHE_START_TIMEOUT", {}) == environment.START_TIMEOUT
    assert value("PREFIXCACHE_COLD", {}) == "reset" and value("PREFIXCACHE_TEXT_ONLY", {}) is False


@pytest.mark.parametrize(
    ("name", "raw", "needle"),
    [("PREFIXCACHE_COLD", "cold", "PREFIXCACHE_COLD='cold' is not one of reset, restart"),
     ("PREFIXCACHE_TEXT_ONLY", "yes", "PREFIXCACHE_TEXT_ONLY='yes' is not 0 or 1"),
     ("PREFIXCACHE_START_TIMEOUT", "-3", "is not a number of seconds above 0"),
     ("PREFIXCACHE_EXTRA_BODY", "[1]", "PREFIXCACHE_EXTRA_BODY='[1]' is not a JSON object"),
     ("PREFIXCACHE_EXTRA_BODY", "{", "is not JSON"),
     ("PREFIXCACHE_CONCURRENCY", "0", "PREFIXCACHE_CONCURRENCY='0' is not an integer >= 1"),
     ("PREFIXCACHE_IMAGE_TOKEN_ID", "x", "PREFIXCACHE_IMAGE_TOKEN_ID='x' is not valid")],
)  # fmt: skip
def test_a_bad_value_names_the_variable(name: str, raw: str, needle: str) -> None:
    with pytest.raises(EngineError, match=re.escape(needle)):
        value(name, {name: raw})


def test_from_env_refuses_a_bad_value_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pytest_prefixcache.adapters.presets import from_env

    monkeypatch.setenv("PREFIXCACHE_SERVER_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("PREFIXCACHE_TEXT_ONLY", "true")
    with pytest.raises(EngineError, match="PREFIXCACHE_TEXT_ONLY='true' is not 0 or 1"):
        from_env()


def names_read(path: Path) -> set[str]:
    """The variable names a module spells as string constants."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and NAME.match(n.value)
    }


def test_the_from_env_functions_read_only_declared_variables(tmp_path: Path) -> None:
    declared = {v.name: v for v in VARIABLES}
    for module, reader in READERS.items():
        read = names_read(ADAPTERS / module)
        undeclared = read - set(declared)
        assert not undeclared, f"{module} reads {sorted(undeclared)}: declare them"
        for name in read:
            assert reader in declared[name].readers, f"{name}: add {reader!r} to its readers"
    # negative control: the scan sees a read
    probe = tmp_path / "probe.py"
    probe.write_text('x = os.environ.get("PREFIXCACHE_NO_SUCH", "")\n', encoding="utf-8")
    assert names_read(probe) == {"PREFIXCACHE_NO_SUCH"}


def test_the_readme_points_at_the_table() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/adapters.md#every-variable-the-adapters-read" in readme
    assert "## Every variable the adapters read" in (ROOT / "docs" / "adapters.md").read_text()
