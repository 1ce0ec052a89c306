"""A self-contained HTML page for a verification report: the verdict and counters, reuse per
request against the oracle, the distribution of logit differences, and each failure with its
stream shown as a conversation, images inline.

Standard library only and cheap to import (no MLX, no numpy)::

    from pytest_prefixcache.html import write_html
    from pytest_prefixcache.output.report import Report

    write_html(Report.read_json("report.json"), "report.html", base_dir=".")
"""

from __future__ import annotations

from .page import render_html, write_html

__all__ = ["render_html", "write_html"]
