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
    ("generation", {"strategies", "_moves"}),
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


ROOT = PACKAGE.parent
#: The lab (third-party engines' scripts, matrices, findings and opt-in tests) and what its
#: folders hold as importable modules.
LAB = ROOT / "engines"
PRODUCT = ("pytest_prefixcache", "reference_engine", "tests", "benchmarks")


def lab_modules(lab: Path = LAB) -> set[str]:
    """The top-level names the lab's folders make importable: its package and modules."""
    names = {p.name for p in lab.iterdir() if (p / "__init__.py").is_file()}
    return names | {p.stem for p in lab.glob("*/*.py") if not (p.parent / "__init__.py").exists()}


def lab_imports(root: Path = ROOT, lab: Path = LAB) -> list[str]:
    """Every import, in the package, the reference engine, the tests or the benchmarks, of a
    module the lab holds."""
    mine = lab_modules(lab) - {"conftest"}
    found = []
    for top in PRODUCT:
        for path in sorted((root / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                found += [
                    f"{path.relative_to(root)}:{node.lineno} imports {n}"
                    for n in names
                    if n.split(".")[0] in mine
                ]
    return found


def test_nothing_in_the_product_or_its_tests_imports_the_lab() -> None:
    assert "lab" in lab_modules() and "test_seed_engines" in lab_modules()
    assert lab_imports() == []


def test_an_import_of_the_lab_is_found(tmp_path: Path) -> None:
    """Negative control: a test that imports the lab's findings package is reported."""
    (tmp_path / "engines" / "lab").mkdir(parents=True)
    (tmp_path / "engines" / "lab" / "__init__.py").write_text("")
    for top in PRODUCT:
        (tmp_path / top).mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("import os\nfrom lab.findings import save\n")
    assert lab_imports(tmp_path, tmp_path / "engines") == ["tests/test_x.py:2 imports lab.findings"]
