"""The public record's runner for the seed engines, vllm-mlx and its fork rapid-mlx.

A version of either is a pure-Python wheel over a large environment (torch, transformers,
mlx-lm, mlx-vlm: about 6.5 GB, engines/seed/run.sh). :func:`install` makes
``.engines/history/<package>-<version>/``: a virtual environment holding only that wheel
(``pip install --no-deps``), over the seed engine's environment (``$SEED_DIR/<engine>``,
default the main checkout's ``.engines/seed``; a ``.pth`` line adds its site-packages after the
venv's own, so the old wheel shadows the seed's version and everything else is the seed's).
The seed environments hold mlx 0.32.4, mlx-lm 0.31.3 and mlx-vlm 0.7.10 (vllm-mlx) or 0.7.2
(rapid-mlx): what vllm-mlx from 0.3.0 on requires (mlx-lm>=0.31.0 in its METADATA), and what
rapid-mlx 0.6 (mlx-lm>=0.31.0, mlx>=0.29.0 in 0.6.50 to 0.6.65), 0.9 and 0.12 require
(mlx-lm>=0.31.3) except 0.12's pin mlx<0.32 (:data:`RUNS_ON`).

The servers are ``adapters.seed.seed_server``'s (under the logit tap, a cache-less cold
server) started in that venv's interpreter; the verifier itself runs in this project's
interpreter, as engines/seed/run.sh runs it. Claim sources are off (``claims = false``: the
old versions' metrics and stats are not the ones ``seed.claim_specs`` reads); the tap's reuse
is still checked against the API's ``cached_tokens`` (rapid-mlx returns it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from history_catalogue import Bug

#: the runners of this module: engine -> the PyPI package
SEED_PACKAGES = {"vllm-mlx": "vllm-mlx", "rapid-mlx": "rapid-mlx"}
#: The rapid-mlx series the runner knows, all before the ``rapid_mlx`` package: their wheels'
#: console scripts are ``vllm_mlx.cli:main`` (read in the entry_points.txt of 0.6.50, 0.6.51,
#: 0.6.64, 0.6.65, 0.9.8 to 0.9.12, 0.10.15, 0.10.16 and 0.12.7 to 0.12.16; 0.12's name the
#: same module's cli_entrypoint, and its main is there too).
RAPID_SERIES = ("0.6", "0.9", "0.10", "0.12")
#: The CLI function by package series, where it is not the adapter's default.
CLI = {("rapid-mlx", s): "vllm_mlx.cli:main" for s in RAPID_SERIES}
#: The cache resets by package series, where the adapter's endpoints do not empty the prefix
#: cache: rapid-mlx 0.12's POST /v1/cache/clear empties only the simple engine's prompt cache
#: and its DELETE /v1/cache only mlx-vlm's (routes/health.py, read in the 0.12.11 wheel; the
#: same clear_cache in 0.9.8's; 0.6.64's server.py has no cache route), so a restart stands
#: in (``"restart"``).
RESETS = {("rapid-mlx", s): "restart" for s in RAPID_SERIES}
#: What the layered environments run on that the wheel's METADATA does not allow.
RUNS_ON = {"rapid-mlx": "mlx 0.32.4 (its wheels of 0.12 pin mlx<0.32)"}
MAIN = Path(__file__).resolve().parents[2]


def seed_dir() -> Path:
    """Where the seed engines' environments are (``SEED_DIR``, else the main checkout's)."""
    if os.environ.get("SEED_DIR"):
        return Path(os.environ["SEED_DIR"])
    common = subprocess.run(
        ["git", "-C", str(MAIN), "rev-parse", "--path-format=absolute", "--git-common-dir"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    main = Path(common).parent if common else MAIN
    return main / ".engines" / "seed"


def _series(bug: Bug, version: str) -> tuple[str, str]:
    return bug.runner, ".".join(version.split(".")[:2])


def cli_of(bug: Bug, version: str) -> str:
    """The CLI function of ``bug``'s engine at ``version`` ("" when it is the adapter's)."""
    return CLI.get(_series(bug, version), "")


def install(bug: Bug, version: str, venv: Path) -> Path:
    """The interpreter of ``venv`` holding ``bug``'s engine at ``version`` over the seed
    environment, made or reused."""
    package = SEED_PACKAGES[bug.runner]
    base = seed_dir() / bug.runner
    sites = sorted((base / "lib").glob("python3*/site-packages"))
    if not sites:
        raise RuntimeError(
            f"{bug.name}: no seed environment at {base} (engines/seed/run.sh install "
            f"{bug.runner}; SEED_DIR names where)"
        )
    python = venv / "bin" / "python"
    probe = f"import importlib.metadata as m; print(m.version({package!r}))"
    if python.is_file():
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == version:
            return python
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "zz-seed.pth").write_text(f"{sites[0]}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    env = {**os.environ, "PIP_CACHE_DIR": str(venv.parent / "pip-cache")}
    subprocess.run([*pip, f"{package}=={version}"], check=True, env=env)
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if done.stdout.strip() != version:
        raise RuntimeError(f"{venv}: {package}=={version} did not install")
    return python


def matrix_text(bug: Bug, version: str, python: Path) -> str:
    """A one-combination matrix file: ``seed_server`` on the engine at ``python``."""
    args = {"engine": bug.runner, "python": str(python), "audit": False, "claims": False}
    if bug.concurrency > 1:
        args["concurrency"] = bug.concurrency
    if cli_of(bug, version):
        args["cli"] = cli_of(bug, version)
    if _series(bug, version) in RESETS:
        args["resets"] = RESETS[_series(bug, version)]
    if bug.served_as:
        args["served_as"] = bug.served_as
    pairs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in args.items())
    text = f'[[config]]\nname = "{bug.name}"\n'
    text += f'engine = "pytest_prefixcache.adapters.seed:seed_server"\nargs = {{ {pairs} }}\n'
    if bug.flags:
        text += f"\n[config.flags]\nbug = {{ on = {json.dumps(bug.flags)} }}\n"
    return text
