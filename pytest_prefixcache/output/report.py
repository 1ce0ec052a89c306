"""The session report: counters the checks fill in, a terminal summary and a JSON file.

:class:`Report` is a plain object: the plugin keeps one in ``config.stash``, the verifier
adds to it, and the terminal summary only prints :meth:`Report.lines`. Under pytest-xdist
each worker sends :meth:`Report.to_json` back to the controller, which :meth:`Report.merge`\\ s
them; :func:`pytest_prefixcache.html.render_html` turns the JSON into a page people read.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .records import FailureRecord, RequestRecord
from .report_data import INCONCLUSIVE, MAX_MESSAGE, MAX_RECORDS, ReportData
from .report_json import FORMAT, report_from_json, report_to_json
from .summary import summarize

__all__ = [
    "FORMAT",
    "INCONCLUSIVE",
    "MAX_MESSAGE",
    "MAX_RECORDS",
    "FailureRecord",
    "Report",
    "RequestRecord",
]


class Report(ReportData):
    """What the verification saw in this session: :class:`.report_data.ReportData` with its
    terminal summary and its JSON file."""

    def lines(self) -> list[str]:
        """The terminal summary, one line per item (see :mod:`.summary`)."""
        return summarize(self).lines()

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data (:mod:`.report_json`)."""
        return report_to_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        """The report written by :meth:`to_json` (older files without records load too)."""
        return report_from_json(cls, data)

    @classmethod
    def read_json(cls, path: str | os.PathLike[str]) -> Report:
        """Load a report file; a missing or malformed file raises ValueError naming it."""
        try:
            with open(path, encoding="utf-8") as fh:
                return cls.from_json(json.load(fh))
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"{os.fspath(path)}: cannot read the report: {exc}") from None

    def write_json(self, path: str | os.PathLike[str]) -> None:
        parent = os.path.dirname(os.fspath(path))
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_json(), fh, indent=1, allow_nan=False, default=str)
            fh.write("\n")
