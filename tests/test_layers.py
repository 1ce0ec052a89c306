"""The plugin's folders are layers: a module imports only from its own layer or those above
it in the table of docs/architecture.md (a back edge would make a layer impossible to read, or
to import, on its own). The reference engine's modules are layered the same way, and use only
the plugin's contract (its types, errors and package data): an engine needs nothing else. No
modules of either package import each other in a circle, through imports inside functions
or under ``if TYPE_CHECKING:`` either (an import moved into a function to dodge a circle is
still one, and a type-only one still ties two modules together: a protocol or a shared lower
module breaks it)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import cast

import pytest_prefixcache
import reference_engine

PACKAGE = Path(pytest_prefixcache.__file__).parent
ENGINE = Path(reference_engine.__file__).parent
#: Top to bottom, as in the table of docs/architecture.md.
LAYERS = (
    ("the contract", {"types", "traits", "reuse_claims", "errors", "image_io", "package_data"}),
    ("test images", {"images"}),
    ("engines", {"adapters", "tap"}),
    ("generation", {"strategies"}),
    ("checks", {"checks"}),
    ("output", {"output", "html"}),
    ("driving an engine", {"verify", "stateful"}),
    ("the pytest session", {"session"}),
    ("entry points", {"plugin", "cli", "suite", "__init__"}),
)


#: The reference engine's layers, top to bottom.
ENGINE_LAYERS = (
    (
        "foundations",
        {
            "tokens",
            "positions",
            "cpu",
            "recurrent",
            "compiled_layers",
            "blocks",
            "fixtures",
            "identity",
            "chunks",
        },
    ),
    (
        "inputs and stores",
        {"families", "render", "vision", "snapshots", "pool", "inflight", "disk"},
    ),
    ("the model", {"kv", "kvquant", "model", "lora"}),
    (
        "the engine",
        {"engine", "resume", "compute", "designs", "stats", "persist", "speculative", "__init__"},
    ),
    ("the HTTP API", {"openai_api"}),
    ("the server, the bug zoo and the block-manager harness", {"server", "mutants", "harness"}),
)
#: The plugin's modules the reference engine may import: the contract.
CONTRACT = {"", "types", "reuse_claims", "traits", "errors", "package_data", "image_io"}
#: ... except the bug zoo's tools, which run the verifier and save what it shrinks.
CONTRACT_EXEMPT = {"mutants/table.py", "mutants/corpus.py"}


def layer(parts: tuple[str, ...], layers: tuple[tuple[str, set[str]], ...] = LAYERS) -> int:
    return next(i for i, (_, tops) in enumerate(layers) if parts[0] in tops)


def imported(
    path: Path, root: Path, name: str = "pytest_prefixcache"
) -> list[tuple[int, tuple[str, ...]]]:
    """(line, module path inside the package ``name``) of every import of its own modules."""
    package = path.relative_to(root).parts[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - node.level + 1]
            names = node.module.split(".") if node.module else [node.names[0].name]
            here = root.joinpath(*base, *names)
            if not node.module and not (here.with_suffix(".py").exists() or here.is_dir()):
                names = ["__init__"]  # a name the package itself defines
            out.append((node.lineno, (*base, *names)))
        elif node.module and node.module.startswith(name + "."):
            out.append((node.lineno, tuple(node.module.split(".")[1:])))
        elif node.module == name:
            out.append((node.lineno, ("__init__",)))
    return out


def back_edges(
    root: Path = PACKAGE,
    layers: tuple[tuple[str, set[str]], ...] = LAYERS,
    name: str = "pytest_prefixcache",
) -> list[str]:
    edges = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        mine = layer(parts, layers)
        for line, target in imported(path, root, name):
            if target and layer(target, layers) > mine:
                theirs = layers[layer(target, layers)][0]
                edges.append(f"{'/'.join(parts)}.py:{line} ({layers[mine][0]}) imports "
                             f"{'.'.join(target)} ({theirs})")  # fmt: skip
    return edges


def beyond_the_contract(root: Path = ENGINE) -> list[str]:
    """Every import, in the reference engine, of a plugin module outside :data:`CONTRACT`."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in CONTRACT_EXEMPT:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                top, _, rest = node.module.partition(".")
                if top == "pytest_prefixcache" and rest.split(".")[0] not in CONTRACT:
                    out.append(f"{rel}:{node.lineno} imports {node.module}")
    return out


def test_every_module_has_a_layer() -> None:
    for path in PACKAGE.rglob("*.py"):
        layer(path.relative_to(PACKAGE).with_suffix("").parts)


def test_no_module_imports_a_layer_below_its_own() -> None:
    assert back_edges() == []


def test_the_reference_engine_is_layered_and_uses_only_the_contract() -> None:
    for path in ENGINE.rglob("*.py"):
        layer(path.relative_to(ENGINE).with_suffix("").parts, ENGINE_LAYERS)
    assert back_edges(ENGINE, ENGINE_LAYERS, "reference_engine") == []
    assert beyond_the_contract() == []


def test_an_engine_import_beyond_the_contract_is_found(tmp_path: Path) -> None:
    """Negative control: an engine module that imports an adapter, and the model that imports
    the engine, are reported."""
    (tmp_path / "model.py").write_text("from .engine import Engine\n")
    engine = "from pytest_prefixcache.types import Outcome\n"
    engine += "from pytest_prefixcache.adapters.http.chat import x\n"
    (tmp_path / "engine.py").write_text(engine)
    assert beyond_the_contract(tmp_path) == [
        "engine.py:2 imports pytest_prefixcache.adapters.http.chat"
    ]
    assert back_edges(tmp_path, ENGINE_LAYERS, "reference_engine") == [
        "model.py:1 (the model) imports engine (the engine)"
    ]


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


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(
    node: ast.Import | ast.ImportFrom, package: list[str], name: str, modules: set[str]
) -> list[str]:
    """The modules of the package ``name`` an import node imports (dotted, inside it)."""
    if isinstance(node, ast.Import):
        return [a.name.partition(".")[2] for a in node.names if a.name.split(".")[0] == name]
    if node.level:
        base = package[: len(package) - node.level + 1]
        module = ".".join([*base, *(node.module.split(".") if node.module else [])])
    elif node.module == name or (node.module or "").startswith(name + "."):
        module = cast(str, node.module).partition(".")[2]
    else:
        return []
    # ``from PACKAGE import NAME`` imports the module NAME if there is one, else PACKAGE
    full = [f"{module}.{a.name}".lstrip(".") for a in node.names]
    return [f if f in modules else module for f in full]


def import_edges(
    root: Path = PACKAGE, name: str = "pytest_prefixcache"
) -> dict[str, list[tuple[str, int, str]]]:
    """For each module of the package at ``root`` (dotted, inside it; a package by its folder),
    (file, line, module) of every import of its own modules: at the top, inside functions and
    classes, and under ``if TYPE_CHECKING:``."""
    paths = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    edges: dict[str, list[tuple[str, int, str]]] = {}
    for mod, path in paths.items():
        package = [p for p in mod.split(".") if p]
        if path.name != "__init__.py":
            package = package[:-1]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        file = path.relative_to(root).as_posix()
        edges[mod] = [
            (file, node.lineno, t)
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for t in dict.fromkeys(_targets(node, package, name, set(paths)))
            if t in paths and t != mod
        ]
    return edges


def import_cycles(root: Path = PACKAGE, name: str = "pytest_prefixcache") -> list[str]:
    """Every set of modules that import each other in a circle (a strongly connected component
    of :func:`import_edges`), with the imports that close it."""
    edges = import_edges(root, name)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        order[v] = low[v] = len(order)
        stack.append(v)
        for _, _, w in edges[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            group: list[str] = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            inner = sorted(
                f"{f}:{n} imports {t}" for m in group for f, n, t in edges[m] if t in group
            )
            if len(group) > 1:
                out.append(f"{', '.join(sorted(group))} ({'; '.join(inner)})")

    for v in edges:
        if v not in order:
            visit(v)
    return sorted(out)


def test_no_import_cycles() -> None:
    """Modules import each other in one direction only, inside functions and under
    ``TYPE_CHECKING`` too (an import moved into a function to dodge a circle is still a
    circle)."""
    assert import_cycles() == []
    assert import_cycles(ENGINE, "reference_engine") == []


def test_an_import_cycle_inside_a_function_is_found(tmp_path: Path) -> None:
    """Negative control: a circle closed by an import inside a function (and one through a
    package's ``__init__``, by ``import``) is reported, and so is one closed under
    ``TYPE_CHECKING``."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from .sub.b import x\n")
    (tmp_path / "sub" / "__init__.py").write_text("")
    (tmp_path / "sub" / "b.py").write_text("def x():\n    from ..a import y\n    return y\n")
    (tmp_path / "sub" / "c.py").write_text("import pkg.sub\n")
    d = "from typing import TYPE_CHECKING\nfrom . import c\n"
    d += "if TYPE_CHECKING:\n    from .e import E\n"
    (tmp_path / "sub" / "d.py").write_text(d)
    (tmp_path / "sub" / "e.py").write_text("from .d import D\n")
    assert import_cycles(tmp_path, "pkg") == [
        "a, sub.b (a.py:1 imports sub.b; sub/b.py:2 imports a)",
        "sub.d, sub.e (sub/d.py:4 imports sub.e; sub/e.py:1 imports sub.d)",
    ]
    (tmp_path / "sub" / "__init__.py").write_text("from .c import z\n")
    assert import_cycles(tmp_path, "pkg")[1] == (
        "sub, sub.c (sub/__init__.py:1 imports sub.c; sub/c.py:1 imports sub)"
    )


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


#: The most lines a module of either package may have (the developers' guide: around 300).
MAX_LINES = 400


def oversized(root: Path, limit: int = MAX_LINES) -> list[str]:
    """Every module under ``root`` longer than ``limit`` lines, with its length."""
    out = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            out.append(f"{path.relative_to(root).as_posix()}: {lines} lines (at most {limit})")
    return out


def test_no_module_passes_400_lines() -> None:
    assert oversized(PACKAGE) + oversized(ENGINE) == []


def test_a_module_past_400_lines_is_found(tmp_path: Path) -> None:
    """Negative control: a module of 401 lines is reported, one of 400 is not."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "long.py").write_text("x = 1\n" * 401)
    (tmp_path / "edge.py").write_text("x = 1\n" * 400)
    assert oversized(tmp_path) == ["sub/long.py: 401 lines (at most 400)"]
