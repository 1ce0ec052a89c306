"""The resolved :class:`Settings` of a session. The validators and defaults of its values live
in :mod:`.values` (re-exported here)."""

from __future__ import annotations

import hashlib
import random
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from ..output.streams import FAILURES_DIR
from ..package_data import FIXTURES
from ..verify.worker import DEFAULT_TIMEOUT
from .option_table import replay_flags
from .values import (
    DEFAULT_DATABASE,
    DEFAULT_ENGINE,
    DEFAULT_EXAMPLES,
    DEFAULT_PARALLEL_STREAMS,
    DEFAULT_PROGRESS,
    DEFAULT_SHRINK_BUDGET,
    DEFAULT_TOLERANCE,
    STATEFUL_STEPS,
    database_spec,
    engine_spec,
    fraction,
    model_dir,
    non_negative_float,
    positive_float,
    positive_int,
    positive_ratio,
    seed,
    server_body,
    server_cmd,
)

__all__ = [
    "DEFAULT_DATABASE",
    "DEFAULT_ENGINE",
    "DEFAULT_EXAMPLES",
    "STATEFUL_STEPS",
    "Settings",
    "database_spec",
    "engine_spec",
    "fraction",
    "model_dir",
    "non_negative_float",
    "positive_float",
    "positive_int",
    "positive_ratio",
    "seed",
    "server_body",
    "server_cmd",
]


@dataclass(frozen=True)
class Settings:
    """The plugin's options for this session, resolved."""

    verify: bool = False
    engine: str = DEFAULT_ENGINE
    engine_source: str = "default"
    model: str | None = None
    """The model directory every engine factory loads (``PREFIXCACHE_MODEL``), absolute;
    None: each engine's own default."""
    model_source: str = "default"
    """Where the model was named: ``option``, ``ini``, ``PREFIXCACHE_MODEL`` or ``matrix``."""
    server_cmd: str | None = None
    """The server command of ``--prefixcache-server-cmd`` (replays start the same one)."""
    server_body: str | None = None
    """``--prefixcache-server-body``: JSON fields added to every request to the server."""
    examples: int = DEFAULT_EXAMPLES
    seed: int = 0
    seed_given: bool = False
    report: Path | None = None
    html: Path | None = None
    timeout: float = DEFAULT_TIMEOUT
    atol: float = DEFAULT_TOLERANCE
    rtol: float = DEFAULT_TOLERANCE
    kl: float | None = None
    min_efficiency: float | None = None
    min_speedup: float | None = None
    replay: Path | None = None
    invocation_dir: Path = Path(".")
    isolation: bool = False
    shards: int = 1
    """Generated tests are split into this many shards, each with its own seed (one per
    pytest-xdist worker by default)."""
    database: str = DEFAULT_DATABASE
    """Hypothesis example database: a directory (relative to the invocation directory),
    a redis:// URL, or "none"."""
    progress: float = DEFAULT_PROGRESS
    shrink_budget: float | None = DEFAULT_SHRINK_BUDGET
    """Examples a failing property may run after its first failure, as a share of its own
    examples (None: Hypothesis's own limits)."""
    """Seconds between progress lines (0: none)."""
    budget: float | None = None
    """Wall-clock seconds: generated tests start new rounds of examples until it is spent."""
    parallel_streams: int = DEFAULT_PARALLEL_STREAMS
    """Generated streams run this many at once, each in its own namespace, on an engine that
    declares concurrent service and namespaces (1: one at a time)."""

    def shard_examples(self, divisor: int = 1) -> int:
        """Examples per shard of a property that runs ``examples / divisor`` in all."""
        return max(1, -(-self.examples // (self.shards * divisor)))

    def shard_seed(self, shard: int, round_: int = 0) -> int:
        """The seed of one shard's round: the session seed itself for shard 0, round 0."""
        if shard == 0 and round_ == 0:
            return self.seed
        blob = f"{self.seed}:{shard}:{round_}".encode()
        return int.from_bytes(hashlib.sha256(blob).digest()[:4], "big")

    @staticmethod
    def random_seed() -> int:
        return random.SystemRandom().randrange(2**32)

    allow_partial: bool = False
    strict_render: bool = False
    """Render-hygiene findings (re-rendered history, volatile prompt bytes) fail."""
    restarts: bool = False
    """Streams restart the engine between requests (``--prefixcache-restarts``)."""
    """A run whose correctness checks could not all run passes, said as partial."""
    failures_to: Path | None = None
    """Where failing streams are saved (default: ``FAILURES_DIR``)."""
    matrix: Path | None = None
    """The matrix file this configuration comes from (its replays name it and the config)."""
    config_name: str | None = None
    """This configuration's name in a matrix run."""
    environment: tuple[tuple[str, str], ...] = ()
    """The variables a run file records (``output.run_file.RECORDED``) as the session
    started, before the plugin exported its own."""

    @property
    def failures_dir(self) -> Path:
        if self.failures_to is not None:
            return self.invocation_dir / self.failures_to
        return self.invocation_dir / FAILURES_DIR

    def flags(self) -> list[str]:
        """The flags that reproduce this run's engine and tolerances."""
        out = ["--prefixcache-verify"]
        if self.matrix is not None:
            out += [
                f"--prefixcache-matrix={self.matrix}",
                f"--prefixcache-config={self.config_name}",
            ]
        elif self.engine_source in ("option", "ini"):  # a replay reads no ini file
            out.append(f"--prefixcache-engine={self.engine}")
        elif self.server_cmd is not None:
            out.append(f"--prefixcache-server-cmd={self.server_cmd}")
        if self.model is not None and self.model_source != "matrix":
            out.append(f"--prefixcache-model={self.model_name}")
        if self.server_body is not None and self.matrix is None:
            out.append(f"--prefixcache-server-body={self.server_body}")
        out += replay_flags(self)
        return out

    @property
    def model_name(self) -> str | None:
        """The model as a flag names it: a shipped fixture by its name, else the directory."""
        if self.model is None:
            return None
        path = Path(self.model)
        return path.name if path.parent == FIXTURES else self.model

    def seed_command(self) -> str:
        """The options that regenerate this run's streams (shards included)."""
        out = f"--prefixcache-seed={self.seed}"
        if self.shards > 1:
            out += f" --prefixcache-shards={self.shards}"
        if self.parallel_streams > 1:  # the streams are drawn in groups: other streams
            out += f" --prefixcache-parallel-streams={self.parallel_streams}"
        return out

    def shown(self, path: str | Path) -> str:
        """``path`` as a replay command names it: relative to the invocation directory when
        it is inside it."""
        p = Path(path)
        try:
            return str(p.relative_to(self.invocation_dir))
        except ValueError:
            return str(p)

    def replay_command(self, path: str, run_file: str | Path | None = None) -> str:
        """The command that replays the stream saved at ``path``: with ``run_file``, the
        ``prefixcache replay`` command that applies the run's settings (flags and
        environment, see ``output.run_file``); without, this interpreter's pytest with the
        flags (the environment is then the shell's)."""
        python = shlex.quote(sys.executable)
        if run_file is not None:
            args = [f"--run={self.shown(run_file)}", self.shown(path)]
            return f"{python} -m pytest_prefixcache.cli replay " + shlex.join(args)
        args = [*self.flags(), f"--prefixcache-replay={self.shown(path)}"]
        return f"{python} -m pytest " + shlex.join(args)
