"""``omlx serve`` with settings that have no command-line flag, for :mod:`.omlx`.

Runs inside oMLX's own environment (stdlib only here), usually under the logit tap:
``python -m pytest_prefixcache.tap pytest_prefixcache.adapters.omlx_launch:main serve
--model-dir DIR ... --setting scheduler.chunked_prefill=true``. Each ``--setting
SECTION.FIELD=VALUE`` (a JSON value, else a string) is written into the ``settings.json`` of
oMLX's base path (``$FMLX_BASE_PATH``, else ``~/.fmlx``: the server's private HOME), which
oMLX reads before its environment and command line (flyto-mlx 0.7.0, ``settings.py``,
``GlobalSettings.load``), except the section ``model``: ``--setting model.FIELD=VALUE`` is a
per-model setting (``ModelSettings``, e.g. ``turboquant_kv_enabled``), written into the base
path's ``model_settings.json`` for every model directory under ``--model-dir``
(``ModelSettingsManager``, model_settings.py). ``--block-size N`` sets the paged cache's block
size, an internal default with no setting (``SchedulerConfig.paged_cache_block_size``, 256):
every scheduler config made in the process gets N unless given one (the scheduler still aligns
it to a rotating window and enlarges it for recurrent hybrids). The other arguments go to
``omlx.cli:main`` as they are.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["main", "split_settings"]


def split_settings(argv: list[str]) -> tuple[list[str], dict[str, dict[str, object]]]:
    """(the arguments for ``omlx``, the settings by section) from ``argv``."""
    rest: list[str] = []
    settings: dict[str, dict[str, object]] = {}
    words = iter(argv)
    for word in words:
        if word != "--setting" and not word.startswith("--setting="):
            rest.append(word)
            continue
        item = word.partition("=")[2] if "=" in word and word.startswith("--setting=") else None
        if item is None:
            item = next(words, "")
        key, eq, raw = item.partition("=")
        section, dot, name = key.partition(".")
        if not eq or not dot or not section or not name:
            raise SystemExit(f"--setting {item!r} is not SECTION.FIELD=VALUE")
        try:
            value: object = json.loads(raw)
        except ValueError:
            value = raw
        settings.setdefault(section, {})[name] = value
    return rest, settings


def _block_size(argv: list[str]) -> tuple[list[str], int | None]:
    """(``argv`` without ``--block-size N``, N or None)."""
    if "--block-size" not in argv:
        return argv, None
    i = argv.index("--block-size")
    value = argv[i + 1] if i + 1 < len(argv) else ""
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"--block-size {value!r} is not a positive int")
    return argv[:i] + argv[i + 2 :], int(value)


def _set_block_size(size: int) -> None:
    from omlx.scheduler import SchedulerConfig

    original = SchedulerConfig.__init__

    def __init__(self: object, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        if "paged_cache_block_size" not in kwargs:
            self.paged_cache_block_size = size  # type: ignore[attr-defined]

    SchedulerConfig.__init__ = __init__  # type: ignore[method-assign]


def _write_model_settings(path: Path, argv: list[str], values: dict[str, object]) -> None:
    """``values`` for every model directory under ``argv``'s ``--model-dir``, in ``path``."""
    if "--model-dir" not in argv or argv.index("--model-dir") + 1 >= len(argv):
        raise SystemExit("--setting model.FIELD=VALUE needs --model-dir DIR")
    model_dir = Path(argv[argv.index("--model-dir") + 1])
    data: dict[str, Any] = {"version": 1, "models": {}}
    if path.is_file():
        data = json.loads(path.read_text())
    for model in sorted(p.name for p in model_dir.iterdir() if p.is_dir()):
        data.setdefault("models", {}).setdefault(model, {}).update(values)
    path.write_text(json.dumps(data, indent=2))


def main() -> int:
    argv, settings = split_settings(sys.argv[1:])
    argv, block = _block_size(argv)
    if block is not None:
        _set_block_size(block)
    if settings:
        env = os.environ.get("FMLX_BASE_PATH") or os.environ.get("OMLX_BASE_PATH")
        base = Path(env) if env else Path.home() / ".fmlx"
        base.mkdir(parents=True, exist_ok=True)
        per_model = settings.pop("model", {})
        path = base / "settings.json"
        data = json.loads(path.read_text()) if path.is_file() else {}
        for section, values in settings.items():
            data.setdefault(section, {}).update(values)
        path.write_text(json.dumps(data, indent=2))
        if per_model:
            _write_model_settings(base / "model_settings.json", argv, per_model)
    from omlx.cli import main as omlx_main

    sys.argv = ["omlx", *argv]
    omlx_main()
    return 0
