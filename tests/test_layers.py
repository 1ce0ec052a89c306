"""The plugin's folders are layers: a module imports only from its own layer or those above
it in the table of docs/architecture.md (a back edge would make a layer impossible to read, or
to import, on its own)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest_prefixcache

PACKAGE = Path(pytest_prefixcache.__file__).parent
#: Top to bottom, as in the table of docs/architecture.md.
LAYERS = (
    ("the contract", {"types", "errors", "image_io", "package_data"}),
    ("test images", {"images"}),
    ("engines", {"adapters", "tap"}),
    ("generation", {"strategies", "waves", "_moves"}),
    ("checks", {"checks"}),
    ("output", {"output", "html"}),
    ("driving an engine", {"verify", "stateful"}),
    ("the pytest session", {"session"}),
    ("entry points", {"plugin", "cli", "suite", "__init__"}),
)


def layer(parts: tuple[str, ...]) -> int:
    return next(i for i, (_, tops) in enumerate(LAYERS) if parts[0] in tops)


def imported(path: Path, root: Path) -> list[tuple[int, tuple[str, ...]]]:
    """(line, module path inside the package) of every import of the package's own modules."""
    package = path.relative_to(root).parts[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - node.level + 1]
            names = node.module.split(".") if node.module else [node.names[0].name]
            out.append((node.lineno, (*base, *names)))
        elif node.module and node.module.startswith("pytest_prefixcache."):
            out.append((node.lineno, tuple(node.module.split(".")[1:])))
    return out


def back_edges(root: Path = PACKAGE) -> list[str]:
    edges = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        mine = layer(parts)
        for line, target in imported(path, root):
            if target and layer(target) > mine:
                edges.append(f"{'/'.join(parts)}.py:{line} ({LAYERS[mine][0]}) imports "
                             f"{'.'.join(target)} ({LAYERS[layer(target)][0]})")  # fmt: skip
    return edges


def test_every_module_has_a_layer() -> None:
    for path in PACKAGE.rglob("*.py"):
        layer(path.relative_to(PACKAGE).with_suffix("").parts)


def test_no_module_imports_a_layer_below_its_own() -> None:
    assert back_edges() == []


def test_a_back_edge_is_found(tmp_path: Path) -> None:
    """Negative control: a checks module that imports the session is reported."""
    (tmp_path / "checks").mkdir()
    (tmp_path / "types.py").write_text("")
    (tmp_path / "checks" / "reuse.py").write_text(
        "from ..types import Outcome\nfrom ..session.settings import Settings\n"
    )
    assert back_edges(tmp_path) == [
        "checks/reuse.py:2 (checks) imports session.settings (the pytest session)"
    ]
