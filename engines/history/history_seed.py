"""The public record's runner for the seed engines, vllm-mlx and its fork rapid-mlx.

A version of either is a pure-Python wheel over a large environment (torch, transformers,
mlx-lm, mlx-vlm: about 6.5 GB, engines/seed/run.sh). :func:`install` makes
``.engines/history/<package>-<version>/``: a virtual environment holding only that wheel
(``pip install --no-deps``), over the seed engine's environment (``$SEED_DIR/<engine>``,
default the main checkout's ``.engines/seed``; a ``.pth`` line adds its site-packages after the
venv's own, so the old wheel shadows the seed's version and everything else is the seed's).
The seed environments hold mlx 0.32.4, mlx-lm 0.31.3 and mlx-vlm 0.7.10 (vllm-mlx) or 0.7.2
(rapid-mlx): what vllm-mlx from 0.2.8 on requires (mlx-lm>=0.31.0, mlx-vlm>=0.4.3 in the
METADATA of 0.2.8, 0.2.9 and 0.3.0; 0.4.0: mlx-lm>=0.31.3, mlx-vlm>=0.6.2), and what
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
RESETS = {
    **{("rapid-mlx", s): "restart" for s in RAPID_SERIES},
    # vllm-mlx 0.2's DELETE /v1/cache clears only mlx-vlm's caches; DELETE /v1/cache/prefix
    # empties the batched engine's prefix store (server.py clear_prefix_cache ->
    # Scheduler.clear_prefix_cache, read in the 0.2.8 and 0.2.9 wheels)
    ("vllm-mlx", "0.2"): "DELETE /v1/cache/prefix, DELETE /v1/cache",
}
#: vllm-mlx's first release with --enable-metrics (commit 9266654, #314; 0.2.8's CLI refuses it)
METRICS_FROM = (0, 2, 9)
#: The series whose simple engine (no ``--continuous-batching``) keeps a system-prompt KV
#: snapshot that no endpoint drops: SimpleEngine._system_kv_snapshot of the MLLM text route,
#: left by clear_runtime_caches (0.3.0) and by DELETE /v1/cache (0.2.8, 0.2.9: it clears only
#: mlx-vlm's caches); 0.4.0's clear_runtime_caches clears its LRU of them (read in the wheels).
SIMPLE_RESTARTS = {("vllm-mlx", "0.2"), ("vllm-mlx", "0.3")}
#: The series and models whose --mllm batched engine restarts: mlx-vlm 0.7.10's qwen2_vl
#: LanguageModel keeps the last request's position ids, and the text prefill of 0.2.9's and
#: 0.3.0's MLLMBatchGenerator after a cache miss runs on them ("[broadcast_shapes] Shapes
#: (1,4,185,16) and (1,1,15,16)", finish_reason 'error'; 0.2.8 does not: seen on servers of
#: each); a restart before every uncached run and every stream makes each miss a server's
#: first request. Not Qwen3.5, whose attention vllm-mlx patches itself (patches/qwen3_5_mllm.py:
#: the stale ids there are the f589fd5 entry's bug, which a restart would hide).
MLLM_RESTARTS = {("vllm-mlx", "0.2", "tiny-qwen2-vl"), ("vllm-mlx", "0.3", "tiny-qwen2-vl")}
#: The series whose chat route dies on any request asking for top_logprobs: rapid-mlx 0.6.64
#: and 0.6.65 read ``chunk.new_token_ids`` (service/helpers.py,
#: _extract_streaming_token_logprobs) off a GenerationOutput that has no such field
#: (engine/base.py): HTTP 500 on every request of the first #435 run, both sides. Asked for
#: none (``want_logprobs = request.logprobs and request.top_logprobs`` in routes/chat.py), the
#: reply is served; the tap reads the logits.
NO_TOP_LOGPROBS = {("rapid-mlx", "0.6")}
#: What the layered environments run on that the wheel's METADATA does not allow.
RUNS_ON = {"rapid-mlx": "mlx 0.32.4 (its wheels of 0.12 pin mlx<0.32)"}
#: The MLX a series runs on where the seed's 0.32.4 does not (installed in the venv, over the
#: seed's): vllm-mlx 0.2 steps its batched engine on a worker thread, and MLX 0.32's streams
#: are per thread: its first cache hit died with "There is no Stream(cpu, 0) in current
#: thread" (0.2.9, --continuous-batching); 0.3.0 catches that error, switches to stepping on
#: the model thread and reschedules the request with its prefix store cleared ("Detected MLX
#: stream/thread mismatch on worker step"), so its first hit is lost. MLX 0.31.2 (what mlx-lm
#: 0.31's history runs use; mlx-lm 0.31.3 requires mlx>=0.31.2) serves both.
MLX = {("vllm-mlx", "0.2"): "0.31.2", ("vllm-mlx", "0.3"): "0.31.2"}
MAIN = Path(__file__).resolve().parents[2]


def seed_dir() -> Path:
    """Where the seed engines' environments are (``SEED_DIR``, else the main checkout's)."""
    return main_engines("seed", "SEED_DIR")


def main_engines(name: str, variable: str) -> Path:
    """``$variable``, else the main checkout's ``.engines/NAME`` (shared by its worktrees)."""
    if os.environ.get(variable):
        return Path(os.environ[variable])
    common = subprocess.run(
        ["git", "-C", str(MAIN), "rev-parse", "--path-format=absolute", "--git-common-dir"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    main = Path(common).parent if common else MAIN
    return main / ".engines" / name


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".")[:3])


def _series(bug: Bug, version: str) -> tuple[str, str]:
    return bug.runner, ".".join(version.split(".")[:2])


def resets_of(bug: Bug, version: str) -> str:
    """The cache resets of ``bug``'s engine at ``version`` ("" when they are the adapter's)."""
    series, words = _series(bug, version), bug.flags.split()
    if series in SIMPLE_RESTARTS and "--continuous-batching" not in words:
        return "restart"
    if (*series, bug.model) in MLLM_RESTARTS and "--mllm" in words:
        return "restart"
    return RESETS.get(series, "")


def companions(bug: Bug, version: str) -> dict[str, str]:
    """The packages installed beside the wheel (:data:`MLX`; none: the seed's)."""
    mlx = MLX.get(_series(bug, version))
    return {"mlx": mlx, "mlx-cpu": mlx} if mlx else {}


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
    wanted = {package: version, **companions(bug, version)}
    wanted.pop("mlx-cpu", None)  # its version is mlx's; importlib names it apart
    probe = (
        "import importlib.metadata as m; print("
        + ", ".join(f"m.version({name!r})" for name in wanted)
        + ")"
    )
    expected = " ".join(wanted.values())
    if python.is_file():
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == expected:
            return python
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next((venv / "lib").glob("python3*/site-packages"))
        (site / "zz-seed.pth").write_text(f"{sites[0]}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    env = {**os.environ, "PIP_CACHE_DIR": str(venv.parent / "pip-cache")}
    others = [f"{name}=={v}" for name, v in companions(bug, version).items()]
    subprocess.run([*pip, f"{package}=={version}", *others], check=True, env=env)
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if done.stdout.strip() != expected:
        raise RuntimeError(f"{venv}: {package}=={version} {' '.join(others)} did not install")
    return python


def matrix_text(bug: Bug, version: str, python: Path) -> str:
    """A one-combination matrix file: ``seed_server`` on the engine at ``python``."""
    args = {"engine": bug.runner, "python": str(python), "audit": False, "claims": False}
    if bug.concurrency > 1:
        args["concurrency"] = bug.concurrency
    if cli_of(bug, version):
        args["cli"] = cli_of(bug, version)
    if resets_of(bug, version):
        args["resets"] = resets_of(bug, version)
    if bug.runner == "vllm-mlx" and _release(version) < METRICS_FROM:
        args["metrics"] = False
    if bug.served_as:
        args["served_as"] = bug.served_as
    if _series(bug, version) in NO_TOP_LOGPROBS:
        args["top_logprobs"] = 0
    pairs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in args.items())
    text = f'[[config]]\nname = "{bug.name}"\n'
    text += f'engine = "pytest_prefixcache.adapters.seed:seed_server"\nargs = {{ {pairs} }}\n'
    if bug.flags:
        text += f"\n[config.flags]\nbug = {{ on = {json.dumps(bug.flags)} }}\n"
    return text
