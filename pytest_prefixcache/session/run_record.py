"""A configuration's run file (:mod:`..output.run_file`): built from its settings and what
its report knows once the engine is built (the tolerance rule the engine reported, the
decode rule), written once beside the saved failing streams at the first failure, and named
by every replay command the configuration prints."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..output.report import Report
from ..output.run_file import RunFile, package_version, split_environment, write_run_file
from .settings import Settings

__all__ = ["RunRecord", "run_file_of"]


def run_file_of(s: Settings, report: Report) -> RunFile:
    """The run file of settings ``s``, with the rules ``report`` names."""
    environment, withheld = split_environment(dict(s.environment))
    return RunFile(
        flags=tuple(s.flags()),
        environment=environment,
        withheld=withheld,
        directory=str(s.invocation_dir),
        python=sys.executable,
        version=package_version(),
        engine=report.engine,
        model=s.model,
        server_cmd=s.server_cmd,
        tolerance=report.tolerance,
        decode_rule=report.decode_rule,
        seed=s.seed,
        seed_options=s.seed_command(),
        examples=s.examples,
    )


@dataclass
class RunRecord:
    """The replay commands of one configuration (``VerifyOptions.replay_command``).

    ``conftest``: a ``prefixcache_engine`` fixture of the project's conftest.py built the
    engine; only the project's pytest rebuilds it, so the command is pytest's (with this
    interpreter), not ``prefixcache replay`` (which reads no conftest.py).
    """

    settings: Settings
    report: Report
    conftest: bool = False
    path: Path | None = None
    """The run file, once written."""
    error: str = ""
    """Why the run file could not be written (the command then names the flags)."""

    def replay_command(self, stream: str) -> str:
        s = self.settings
        if self.conftest:
            return s.replay_command(stream)
        if self.path is None and not self.error:
            try:
                self.path = write_run_file(run_file_of(s, self.report), s.failures_dir)
            except OSError as exc:
                self.error = f"could not write the run file into {s.failures_dir}: {exc}"
            self.report.run_file = "" if self.path is None else str(self.path.resolve())
        if self.path is None:
            return f"{s.replay_command(stream)}  # {self.error}"
        return s.replay_command(stream, self.path)

    def to_json(self) -> dict[str, Any]:
        """The run's settings as the reports carry them (``report.json``'s ``run``)."""
        return run_file_of(self.settings, self.report).to_json()
