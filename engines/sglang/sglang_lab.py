"""The SGLang lab's engine factory for the matrix (engines/sglang/matrix.toml) and the targeted
tests (engines/sglang/test_sglang_server.py): where SGLang's interpreter and the tiny HF models are.

``SGLANG_PYTHON``: the command line of SGLang's interpreter (default: ``nice -n 5`` and
``$ENGINES_DIR/sglang/venv/bin/python``); ``SGLANG_MODELS``: the directory
engines/sglang/build_models.py wrote (default ``$ENGINES_DIR/sglang/models``); ``ENGINES_DIR``
defaults to the .engines/ folder of the main checkout (git-ignored, shared by its worktrees).
Importable with engines/sglang on ``sys.path`` (engines/sglang/verify.sh puts it there).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.sglang import sglang_server

__all__ = ["engine", "engines_dir", "installed", "model_dir", "python"]

HERE = Path(__file__).resolve().parent
MODELS = {"text": "tiny-llama-hf", "vl": "tiny-qwen2-vl-hf"}


def engines_dir() -> Path:
    """``$ENGINES_DIR``, else the main checkout's .engines/ (worktrees share it)."""
    if os.environ.get("ENGINES_DIR"):
        return Path(os.environ["ENGINES_DIR"])
    try:
        common = subprocess.run(
            ["git", "-C", str(HERE), "rev-parse", "--path-format=absolute", "--git-common-dir"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        return Path(common).parent / ".engines"
    except (OSError, subprocess.SubprocessError):
        return HERE.parents[1] / ".engines"


def venv_python() -> Path:
    return engines_dir() / "sglang" / "venv" / "bin" / "python"


def installed() -> bool:
    """Whether engines/sglang/install.sh has installed SGLang here."""
    return venv_python().is_file()


def python() -> str:
    return os.environ.get("SGLANG_PYTHON") or f"nice -n 5 {venv_python()}"


def model_dir(model: str = "text") -> Path:
    root = Path(os.environ.get("SGLANG_MODELS") or engines_dir() / "sglang" / "models")
    return root / MODELS[model]


def engine(
    flags: Sequence[str] = (),
    *,
    model: str = "text",
    cold: str = "server",
    audit: bool = False,
    metrics: bool = True,
) -> OpenAIEngine:
    """:func:`sglang_server` on the lab's model with the matrix combination's ``flags``
    (``--enable-cache-report`` is one of them: the combination decides). ``audit=False`` by
    default: the baseline audit starts a new SGLang server per audited request, minutes each
    here; the cold server has no radix cache and every cold reply must report 0 cached tokens."""
    return sglang_server(
        model_dir(model),
        flags,
        python=python(),
        cold=cold,
        cache_report=False,
        metrics=metrics,
        audit=audit,
    )
