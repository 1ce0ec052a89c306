"""Serve a fixture under a hub repository's name, offline: for engines that choose what they do
by the model's name (rapid-mlx's alias profiles turn hybrid prefix reuse on for names they
know, never for a directory), so that a run reaches the code path a user of that model gets.

``python -m pytest_prefixcache.adapters.hub_alias ORG/NAME=DIR -- ARGS...`` lays out a
Hugging Face hub cache under ``$HF_HUB_CACHE`` (the server's private HOME, :func:`alias_env`)
in which the repository ``ORG/NAME`` is ``DIR`` (its files linked, one snapshot, ``refs/main``
naming it), then runs ``python ARGS...`` in its place: with ``HF_HUB_OFFLINE=1`` a loader
asked for ``ORG/NAME`` finds the fixture and nothing is downloaded. Only the name changes:
weights, tokenizer and chat template are the fixture's.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import EngineError

__all__ = ["alias_env", "launcher", "lay_out", "main"]

MODULE = "pytest_prefixcache.adapters.hub_alias"


def _check(repo: str) -> None:
    org, _, name = repo.partition("/")
    if not org or not name or "/" in name or any(c.isspace() for c in repo):
        raise EngineError(f"served_as {repo!r} is not a hub repository id ORG/NAME")


def lay_out(cache: Path, repo: str, model_dir: Path) -> Path:
    """The snapshot directory of ``repo`` in the hub cache ``cache``: ``model_dir``'s files,
    linked (made once; an existing layout is kept)."""
    _check(repo)
    if not (model_dir / "config.json").is_file():
        raise EngineError(f"served_as {repo!r}: {model_dir} has no config.json (not a model)")
    commit = hashlib.sha1(str(model_dir.resolve()).encode()).hexdigest()
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in sorted(model_dir.iterdir()):
        link = snapshot / f.name
        if f.is_file() and not link.exists():
            link.symlink_to(f.resolve())
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    return snapshot


def alias_env() -> dict[str, str]:
    """The server environment the layout lives in: its private HOME, offline."""
    return {"HF_HUB_CACHE": "{home}/hub", "HF_HUB_OFFLINE": "1"}


def launcher(python: str, repo: str, model_dir: str | os.PathLike[str]) -> list[str]:
    """The words before ``ARGS`` that start ``python ARGS`` with ``repo`` laid out first."""
    _check(repo)
    return [python, "-m", MODULE, f"{repo}={Path(model_dir).resolve()}", "--"]


def main(argv: Sequence[str] | None = None) -> None:
    words = list(sys.argv[1:] if argv is None else argv)
    if len(words) < 3 or "=" not in words[0] or words[1] != "--":
        raise SystemExit(f"usage: python -m {MODULE} ORG/NAME=DIR -- ARGS...")
    repo, _, model = words[0].partition("=")
    cache = os.environ.get("HF_HUB_CACHE")
    if not cache:
        raise SystemExit(f"{MODULE}: HF_HUB_CACHE is not set (the hub cache to lay out)")
    try:
        lay_out(Path(cache), repo, Path(model))
    except EngineError as exc:
        raise SystemExit(f"{MODULE}: {exc}") from None
    os.execv(sys.executable, [sys.executable, *words[2:]])


if __name__ == "__main__":
    main()
