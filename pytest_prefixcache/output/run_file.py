"""The run file: a run's settings, written once beside its saved failing streams, so that a
replay from a clean shell (no ``PREFIXCACHE_*`` variable set) rebuilds the same engine.

A run file looks like::

    {"format": "pytest-prefixcache/run/v1",
     "python": "/venv/bin/python", "version": "0.1.0", "directory": "/src/project",
     "engine": "pytest_prefixcache.adapters.presets:from_env serving ...",
     "model": "/src/fixtures/tiny-llama", "server_cmd": "...",
     "tolerance": "atol 1e-05 (...)", "decode_rule": "",
     "seed": 1, "seed_options": "--prefixcache-seed=1", "examples": 5,
     "flags": ["--prefixcache-verify", "--prefixcache-server-cmd=...", ...],
     "environment": {"PREFIXCACHE_TAP_SERVER": "1", "SEED_ENGINE": "rapid-mlx", ...},
     "withheld": ["PREFIXCACHE_DATABASE"]}

``flags`` (the pytest options that name the engine and its tolerances) and ``environment``
(every variable of :data:`RECORDED` the run was started with) are what a replay applies, in
``directory``. A variable that may hold a credential (:func:`is_withheld`: the example
database's URL, a name ending in ``_TOKEN``, ``_KEY``, ``_SECRET``, ``_PASSWORD``, a value with
``user:password@`` or ``TOKEN=``) is named under ``withheld``, not written: a CI artifact
carries no secret, and a replay takes it from its own shell. The rest says what the run was
(the tolerance rule the built engine reported, the interpreter, the package version, the seed
that drew its streams). The file's name is a hash of its content (``run-<12 hex>.json``): runs
that share a failures directory never overwrite each other's settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from ..errors import PrefixCacheError

__all__ = [
    "FORMAT",
    "RECORDED",
    "RunFile",
    "is_recorded",
    "is_withheld",
    "load_run_file",
    "package_version",
    "recorded_environment",
    "split_environment",
    "write_run_file",
]

FORMAT = "pytest-prefixcache/run/v1"
#: The variables a run file records: name prefixes (the plugin's own, the engine presets'
#: ``SEED_*``/``OMLX_*``/``VLLM_*``, mlx-vlm's APC switches) and exact names (offline mode).
RECORDED = (
    "PREFIXCACHE_", "SEED_", "OMLX_", "VLLM_", "APC_", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
)  # fmt: skip


def recorded_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` a run file keeps (:data:`RECORDED`), sorted by name."""
    return {k: environ[k] for k in sorted(environ) if is_recorded(k)}


def is_recorded(name: str) -> bool:
    return any(name == r or (r.endswith("_") and name.startswith(r)) for r in RECORDED)


_SECRET_NAMES = ("_TOKEN", "_KEY", "_SECRET", "_PASSWORD", "_CREDENTIALS")
_SECRET_VALUE = re.compile(r"://[^/\s@]*:[^/\s@]*@|(?i:token|secret|password|api_?key)\s*=")


def is_withheld(name: str, value: str) -> bool:
    """A variable that may hold a credential: never written into a run file or a report."""
    return (
        name == "PREFIXCACHE_DATABASE"
        or name.endswith(_SECRET_NAMES)
        or _SECRET_VALUE.search(value) is not None
    )


def split_environment(env: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """``env`` (recorded variables) as the variables a run file writes and the names it
    withholds (:func:`is_withheld`)."""
    kept = {k: v for k, v in env.items() if not is_withheld(k, v)}
    return kept, tuple(sorted(k for k in env if k not in kept))


def package_version() -> str:
    try:
        return metadata.version("pytest-prefixcache")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class RunFile:
    """One run's settings (see the module's docstring for each field)."""

    flags: tuple[str, ...]
    environment: dict[str, str] = field(default_factory=dict, hash=False)
    withheld: tuple[str, ...] = ()
    directory: str = ""
    python: str = ""
    version: str = ""
    engine: str = ""
    model: str | None = None
    server_cmd: str | None = None
    tolerance: str = "exact"
    decode_rule: str = ""
    seed: int | None = None
    seed_options: str = ""
    examples: int | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["flags"] = list(self.flags)
        data["withheld"] = list(self.withheld)
        return {"format": FORMAT, **data}

    @property
    def name(self) -> str:
        """``run-<hash of the content>.json``."""
        blob = json.dumps(self.to_json(), sort_keys=True).encode()
        return f"run-{hashlib.sha256(blob).hexdigest()[:12]}.json"

    @classmethod
    def from_json(cls, data: Any, where: str) -> RunFile:
        """The run ``data`` holds; a wrong field raises PrefixCacheError naming ``where``
        (the file) and the field."""
        if not isinstance(data, dict):
            raise PrefixCacheError(f"run file {where}: is {data!r:.60}, expected a JSON object")
        if data.get("format") != FORMAT:
            raise PrefixCacheError(
                f"run file {where}: format is {data.get('format')!r}, expected {FORMAT!r} "
                "(not a run file, or from another version of pytest-prefixcache)"
            )
        flags = data.get("flags")
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise PrefixCacheError(f"run file {where}: flags: is {flags!r:.60}, expected a "
                                   "JSON array of strings")  # fmt: skip
        bad = [f for f in flags if not f.startswith("--prefixcache-")]
        if bad:
            raise PrefixCacheError(
                f"run file {where}: flags: {bad[0]!r} is not a --prefixcache-* option"
            )
        env = data.get("environment", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise PrefixCacheError(f"run file {where}: environment: is {env!r:.60}, expected "
                                   "a JSON object of strings")  # fmt: skip
        withheld = data.get("withheld", [])
        if not isinstance(withheld, list) or not all(isinstance(w, str) for w in withheld):
            raise PrefixCacheError(f"run file {where}: withheld: is {withheld!r:.60}, expected "
                                   "a JSON array of variable names")  # fmt: skip
        alien = [k for k in [*env, *withheld] if not is_recorded(k)]
        if alien:
            raise PrefixCacheError(
                f"run file {where}: {'environment' if alien[0] in env else 'withheld'}: "
                f"{alien[0]!r} is not a variable a run records "
                f"({', '.join(RECORDED)})"
            )
        for key, kind in _KINDS.items():
            value = data.get(key)
            if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
                raise PrefixCacheError(
                    f"run file {where}: {key}: is {value!r:.60}, expected "
                    f"{'an integer' if kind is int else 'a string'}"
                )
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, "flags": tuple(flags), "environment": dict(env),
                      "withheld": tuple(withheld)})  # fmt: skip


_KINDS: dict[str, type] = {
    "directory": str, "python": str, "version": str, "engine": str, "model": str,
    "server_cmd": str, "tolerance": str, "decode_rule": str, "seed": int,
    "seed_options": str, "examples": int,
}  # fmt: skip


def write_run_file(run: RunFile, directory: str | os.PathLike[str]) -> Path:
    """Write ``run`` as ``directory/run-<hash>.json`` (once: the same run writes the same
    file; written whole, so that pytest-xdist workers writing it at once never leave half a
    file)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    path = out / run.name
    if not path.exists():
        tmp = out / f".{run.name}.{os.getpid()}"
        tmp.write_text(json.dumps(run.to_json(), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    return path


def load_run_file(path: str | os.PathLike[str]) -> RunFile:
    """Read a run file; a missing, unreadable or malformed file raises PrefixCacheError
    naming it and what is wrong."""
    p = Path(path)
    where = repr(str(p))
    if p.is_dir():
        raise PrefixCacheError(f"run file {where} is a directory, not a run-*.json file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PrefixCacheError(f"cannot read run file {where}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PrefixCacheError(f"run file {where} is not valid JSON: {exc}") from None
    return RunFile.from_json(data, where)
