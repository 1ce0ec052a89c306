"""Where the files that ship with the package are: the scenario corpus and the tiny models.

A source checkout keeps them in the repository's ``fixtures/``; a wheel (or an install from the
sdist) carries the same directory as ``pytest_prefixcache/fixtures/`` (pyproject.toml maps one
onto the other). Either way they are found from any working directory, nothing is built or
downloaded at run time, and nothing is written outside them.

Which model an engine factory loads is one rule, :func:`resolve_model`: a fixture folder's name
(``tiny-qwen3.5-vl``), else a directory path (relative to a base directory, the invocation
directory by default) that has a ``config.json``. ``--prefixcache-model`` resolves it and
exports the absolute path as ``PREFIXCACHE_MODEL`` (:data:`MODEL_ENV`); the factories read it
with :func:`model_from_env`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import EngineError, PrefixCacheError

__all__ = [
    "CORPUS",
    "FIXTURES",
    "MODEL_ENV",
    "engine_model",
    "fixture_model",
    "fixture_models",
    "is_vision_model",
    "model_from_env",
    "require_model",
    "resolve_model",
]

_INSTALLED = Path(__file__).resolve().parent / "fixtures"
_CHECKOUT = Path(__file__).resolve().parent.parent / "fixtures"

#: The installed copy when there is one (a wheel), else the source checkout's ``fixtures/``.
FIXTURES: Path = _INSTALLED if _INSTALLED.is_dir() else _CHECKOUT
#: The built-in scenario corpus (``*.json`` request streams, one directory level).
CORPUS: Path = FIXTURES / "corpus"
#: The variable that names the model directory every engine factory loads (set by
#: ``--prefixcache-model``; a fixture name or a directory).
MODEL_ENV = "PREFIXCACHE_MODEL"


def fixture_model(name: str) -> Path:
    """The shipped tiny model directory ``name`` (``tiny-qwen2-vl``, ``tiny-llama``,
    ``tiny-qwen3.5-vl``, ``tiny-qwen3.5``, ``tiny-gemma3``, ``tiny-gemma3-text``); raise
    PrefixCacheError naming the path when it is missing (a broken install or checkout)."""
    path = FIXTURES / name
    if not (path / "config.json").is_file():
        raise PrefixCacheError(
            f"the fixture model {name!r} is missing: {str(path)!r} has no config.json "
            f"(rebuild it offline with: python -m reference_engine.fixtures --out {FIXTURES})"
        )
    return path


def fixture_models() -> list[str]:
    """The names of the shipped model fixtures (folders of ``FIXTURES`` with a config.json)."""
    if not FIXTURES.is_dir():
        return []
    return sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())


def resolve_model(name_or_dir: str | os.PathLike[str], base: Path | None = None) -> Path:
    """The absolute model directory ``name_or_dir`` names: a fixture folder's name first
    (``tiny-qwen3.5-vl``), else a directory path, relative ones against ``base`` (default: the
    working directory); raise EngineError naming the value and the fixture names."""
    text = os.fspath(name_or_dir)
    if text and os.sep not in text and "/" not in text and text not in (".", ".."):
        fixture = FIXTURES / text
        if (fixture / "config.json").is_file():
            return fixture
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = (base if base is not None else Path.cwd()) / path
    if text.strip() and (path / "config.json").is_file():
        return path.resolve()
    why = "no such directory" if not path.is_dir() else "a directory without a config.json"
    raise EngineError(
        f"{text!r} is not a fixture model ({', '.join(fixture_models()) or 'none installed'}) "
        f"or a model directory ({str(path)!r}: {why})"
    )


def model_from_env(default: str) -> Path:
    """The model directory ``PREFIXCACHE_MODEL`` names (a fixture name or a directory), else
    the fixture ``default``; raise EngineError naming the variable when its value names
    neither (and the path when the default fixture is missing)."""
    value = os.environ.get(MODEL_ENV, "").strip()
    try:
        if not value:
            return fixture_model(default)
    except PrefixCacheError as exc:
        raise EngineError(str(exc)) from None
    try:
        return resolve_model(value)
    except EngineError as exc:
        raise EngineError(f"{MODEL_ENV}={value}: {exc}") from None


def model_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The model directory's config.json; EngineError naming the file when it cannot be read or
    is not a JSON object."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot read {path}/config.json: {exc}") from None
    if not isinstance(config, dict):
        raise EngineError(f"{path}/config.json is not a JSON object")
    return config


def is_vision_model(path: str | os.PathLike[str]) -> bool:
    """Whether the model directory's config.json describes a vision-language model (it has a
    ``vision_config``); False when there is no readable config.json."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "vision_config" in config


def require_model(path: Path, *, vision: bool, who: str) -> Path:
    """``path`` when it is the kind of model ``who`` (an engine) runs: a vision-language model
    (``vision=True``) or a text-only one; else EngineError naming the directory, what it lacks
    and the fixtures of the right kind."""
    if is_vision_model(path) == vision:
        return path
    kinds = [n for n in fixture_models() if is_vision_model(FIXTURES / n) == vision]
    if vision:
        what = "has no vision_config in its config.json (a text-only model)"
        need = "a vision-language model"
    else:
        what = "has a vision_config in its config.json (a vision-language model, not text only)"
        need = "a text-only model"
    raise EngineError(
        f"{who} needs {need}: {str(path)!r} {what}; the fixtures of that kind: "
        f"{', '.join(kinds) or 'none'}"
    )


def engine_model(
    model_dir: str | os.PathLike[str] | None, *, default: str, vision: bool, who: str
) -> Path:
    """The model an engine factory loads: ``model_dir`` when given (a fixture name or a
    directory), else :func:`model_from_env` with the fixture ``default``; checked to be the
    kind ``who`` runs (:func:`require_model`)."""
    path = model_from_env(default) if model_dir is None else resolve_model(model_dir)
    return require_model(path, vision=vision, who=who)
