"""Installed the way users install it: the wheel carries the corpus and the tiny models and
verifies from an empty directory like the clone does; the sdist carries and runs its own tests.

The wheel and sdist are built offline from a copy of the source tree (setuptools' build backend
called directly, no build isolation, no pip cache), into ``tmp_path``; nothing is written to the
clone, ``~/.cache`` or the temp directory outside ``tmp_path``. The installed run points HOME,
XDG_CACHE_HOME and TMPDIR into ``tmp_path`` and checks they are left empty (but for MLX's own
kernel cache).
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterable, Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pytest_prefixcache", "reference_engine")
#: Never copied into the build tree: environments, build output, caches.
UNSHIPPED = (
    ".git",
    ".venv",
    ".engines",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".prefixcache",
    ".hypothesis",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
)
#: A few examples keep the installed run cheap; the clone's own tests cover depth.
EXAMPLES = "2"


def listed_packages(pyproject: Path = ROOT / "pyproject.toml") -> set[str]:
    toml = importlib.import_module("tomllib") if sys.version_info >= (3, 11) else None
    toml = toml or pytest.importorskip("tomli")  # Python 3.10: tomllib's original
    return set(toml.loads(pyproject.read_text())["tool"]["setuptools"]["packages"])


def package_folders(root: Path = ROOT) -> set[str]:
    """Every package folder (one with ``__init__.py``) of the two shipped packages."""
    return {
        ".".join(init.parent.relative_to(root).parts)
        for top in PACKAGES
        for init in (root / top).rglob("__init__.py")
    }


def missing_from_wheel(names: Iterable[str], root: Path = ROOT) -> list[str]:
    """Source files the wheel ``names`` lacks: every module and py.typed of the packages, and
    every file of ``fixtures/`` (as ``pytest_prefixcache/fixtures/...``)."""
    want = [
        str(p.relative_to(root))
        for top in PACKAGES
        for p in (root / top).rglob("*")
        if p.is_file() and (p.suffix == ".py" or p.name == "py.typed")
    ]
    want += [
        "pytest_prefixcache/" + str(p.relative_to(root))
        for p in (root / "fixtures").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    have = set(names)
    return sorted(w for w in want if w not in have)


def test_every_package_folder_is_listed_in_pyproject() -> None:
    unlisted = package_folders() - listed_packages()
    assert not unlisted, (
        f"package folders missing from [tool.setuptools] packages in pyproject.toml (the wheel "
        f"would not carry them): {sorted(unlisted)}"
    )


def test_an_unlisted_package_folder_is_found(tmp_path: Path) -> None:
    """Negative control: a new subpackage that pyproject.toml does not list is reported."""
    (tmp_path / "pytest_prefixcache" / "newlayer").mkdir(parents=True)
    (tmp_path / "pytest_prefixcache" / "__init__.py").write_text("")
    (tmp_path / "pytest_prefixcache" / "newlayer" / "__init__.py").write_text("")
    (tmp_path / "reference_engine").mkdir()
    (tmp_path / "reference_engine" / "__init__.py").write_text("")
    found = package_folders(tmp_path) - listed_packages()
    assert found == {"pytest_prefixcache.newlayer"}


def test_a_file_missing_from_the_wheel_is_named() -> None:
    """Negative control for the wheel-contents check: dropping one corpus file is reported."""
    corpus = sorted((ROOT / "fixtures" / "corpus").glob("*.json"))[0]
    dropped = "pytest_prefixcache/" + str(corpus.relative_to(ROOT))
    complete = [*missing_from_wheel([]), "unrelated"]
    assert missing_from_wheel([n for n in complete if n != dropped]) == [dropped]


# --- building (slow: each build copies the tree and runs setuptools, about a second) ---


def build(kind: str, out: Path) -> Path:
    """Build a wheel or sdist from a copy of the source tree into ``out``; return its path."""
    if int(version("setuptools").split(".")[0]) < 77:
        pytest.skip(f"setuptools {version('setuptools')} < 77 cannot build the PEP 639 license "
                    "metadata; install the dev extra")  # fmt: skip
    src = out / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*UNSHIPPED))
    (out / "dist").mkdir()
    code = f"import setuptools.build_meta as b; print(b.build_{kind}({str(out / 'dist')!r}))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=src, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"building the {kind} failed:\n{done.stdout}\n{done.stderr}"
    return out / "dist" / done.stdout.strip().splitlines()[-1]


def clean_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH to the clone, caches and temp files
    pointed into ``tmp_path`` (checked empty afterwards), offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST"))}
    for name in ("home", "tmp"):
        (tmp_path / name).mkdir(exist_ok=True)
    env |= {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "home" / ".cache"),
            "TMPDIR": str(tmp_path / "tmp"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    return env


#: MLX's CPU kernel cache: compiled kernels under ``$TMPDIR/mlx/<version>/cpu``, one cache per
#: MLX version that every later MLX process reuses (MLX's own, not a per-process leftover).
MLX_KERNELS = re.compile(r"^tmp/mlx(/[^/]+(/cpu(/[^/]+\.(cpp|so))?)?)?$")


def leftovers(tmp_path: Path) -> list[str]:
    """What the run left in HOME and TMPDIR, but MLX's kernel cache."""
    found = (
        str(p.relative_to(tmp_path)) for d in ("home", "tmp") for p in (tmp_path / d).rglob("*")
    )
    return sorted(f for f in found if not MLX_KERNELS.match(f))


def run(cmd: list[str | Path], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def verify_args(*extra: str) -> list[str]:
    return ["-m", "pytest", "--prefixcache-verify", "--pyargs", "pytest_prefixcache.suite",
            "-p", "no:cacheprovider", *extra]  # fmt: skip


def collected(output: str) -> list[str]:
    """Test names (``test_x[param]``) of ``--collect-only -q`` output, whatever the path."""
    return sorted(line.split("::", 1)[1] for line in output.splitlines() if "::" in line)


@pytest.fixture(autouse=True)
def _removed_afterwards(tmp_path: Path) -> Iterator[None]:
    """Builds, venvs and runs take tens of MB: remove them, not only pytest's old basetemps."""
    yield
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with only the built wheel installed; the dependencies (pytest, numpy,
    mlx, ...) are reused from this interpreter's site-packages through a ``.pth`` line, which
    adds the directory but not its ``.pth`` files (so not the clone's editable install)."""
    pytest.importorskip("mlx.core")
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build("wheel", tmp)
    names = zipfile.ZipFile(wheel).namelist()
    assert missing_from_wheel(names) == [], "the wheel lacks source files"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                  tmp, dict(os.environ)).stdout.strip()  # fmt: skip
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "reused_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
           "--no-index", "--no-cache-dir", "--quiet", wheel]  # fmt: skip
    done = run(pip, tmp, dict(os.environ))
    assert done.returncode == 0, f"installing {wheel.name} failed:\n{done.stderr}"
    yield python
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_the_installed_wheel_finds_its_corpus_and_models(installed: Path, tmp_path: Path) -> None:
    code = (
        "from pytest_prefixcache.package_data import CORPUS, FIXTURES\n"
        "from pytest_prefixcache.output.streams import corpus_files\n"
        "from pytest_prefixcache.adapters.mlx_lm import tiny_llama\n"
        "from reference_engine import default_model_path\n"
        "import pytest_prefixcache\n"
        "print(pytest_prefixcache.__file__)\n"
        "print(FIXTURES)\n"
        "print(default_model_path())\n"
        "print(len(corpus_files()))\n"
        "print(type(tiny_llama()).__name__)\n"
    )
    env = clean_env(tmp_path)
    (tmp_path / "empty").mkdir()
    done = run([installed, "-c", code], tmp_path / "empty", env)
    assert done.returncode == 0, done.stderr
    module, fixtures, model, n_corpus, engine = done.stdout.split()
    site = installed.parent.parent
    assert Path(module).is_relative_to(site), f"imported from {module}, not the wheel"
    assert Path(fixtures) == Path(module).parent / "fixtures"
    assert Path(model) == Path(fixtures) / "tiny-qwen2-vl"
    assert int(n_corpus) == len(list((ROOT / "fixtures" / "corpus").glob("*.json")))
    assert engine == "MlxLmEngine"
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_the_installed_wheel_verifies_like_the_clone(installed: Path, tmp_path: Path) -> None:
    """Same tests collected as from the clone; the default verification passes from an empty
    directory; the mutant only the corpus catches fails it; HOME and TMPDIR stay empty.

    The mutant (a volatile billing header rendered into the prompt) is a render-hygiene
    finding, an efficiency tier that fails the verdict only with ``--strict-render``; without
    the shipped corpus nothing finds it at all (the generated streams have no such header)."""
    env, empty = clean_env(tmp_path), tmp_path / "empty"
    empty.mkdir()
    from_clone = run([sys.executable, *verify_args("--collect-only", "-q")], ROOT,
                     os.environ | {"PYTHONPATH": str(ROOT)})  # fmt: skip
    from_wheel = run([installed, *verify_args("--collect-only", "-q")], empty, env)
    assert from_wheel.returncode == 0, from_wheel.stdout + from_wheel.stderr
    assert collected(from_wheel.stdout) == collected(from_clone.stdout) != []

    done = run([installed, *verify_args(f"--prefixcache-examples={EXAMPLES}")], empty, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "verdict: PASS" in done.stdout
    assert re.search(r"\b7 passed, 1 deselected\b", done.stdout), done.stdout[-1500:]
    assert "prefixcache: 1 deselected: test_replay, which runs only with" in done.stdout

    mutant = "reference_engine.mutants:volatile_header_kept"
    prefixcache = installed.parent / "prefixcache"
    caught = run([prefixcache, "verify", "--engine", mutant, "--examples", EXAMPLES,
                  "--strict-render", "--out", tmp_path / "out"], empty, env)  # fmt: skip
    assert caught.returncode == 1, caught.stdout[-3000:] + caught.stderr[-3000:]
    assert re.search(r"^FAILED \S*::test_corpus\[claude_code_billing_header\]", caught.stdout,
                     re.MULTILINE), caught.stdout[-3000:]  # fmt: skip
    assert leftovers(tmp_path) == [], "files left in HOME or TMPDIR"


@pytest.mark.slow
def test_the_sdist_carries_and_collects_its_own_tests(tmp_path: Path) -> None:
    """The sdist has the tests' support modules, conftest.py, fixtures and LICENSE, and its
    test suite collects without errors, as many tests as the clone."""
    sdist = build("sdist", tmp_path)
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12+: refuse links out of the tree
            tar.extractall(tmp_path / "x", filter="data")
        else:
            tar.extractall(tmp_path / "x")  # our own sdist, just built
    tree = tmp_path / "x" / sdist.name.removesuffix(".tar.gz")
    for needed in ("LICENSE", "conftest.py", "tests/plugin_support.py", "tests/conftest.py",
                   "fixtures/tiny-qwen2-vl/model.safetensors",
                   "fixtures/corpus/claude_code_billing_header.json"):  # fmt: skip
        assert (tree / needed).is_file(), f"the sdist lacks {needed}"
    assert "License-Expression: MIT" in (tree / "PKG-INFO").read_text()

    def pytest_in(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
        env = os.environ | {"PYTHONPATH": str(where), "PYTHONDONTWRITEBYTECODE": "1"}
        return run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], where, env)

    from_sdist, from_clone = (
        pytest_in(tree, "--collect-only", "-q"),
        pytest_in(ROOT, "--collect-only", "-q"),
    )
    assert from_sdist.returncode == 0, from_sdist.stdout[-3000:] + from_sdist.stderr[-2000:]
    assert collected(from_sdist.stdout) == collected(from_clone.stdout) != []
    # and runs them: a cheap sample that reads its own package folders and fixtures
    sample = ["tests/test_layers.py", "tests/test_image_input.py",
              "tests/test_plugin_replay.py::test_the_corpus_scenarios_load"]  # fmt: skip
    ran = pytest_in(tree, "-q", *sample)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert re.search(r"\b\d+ passed\b", ran.stdout) and "failed" not in ran.stdout, ran.stdout
