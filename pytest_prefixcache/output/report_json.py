"""The session report's JSON form (``report.json``, format :data:`FORMAT`): what
:meth:`.report.Report.to_json` writes and :meth:`.report.Report.from_json` reads back. JSON has
no inf or NaN: such figures are written as strings and read back as floats."""

from __future__ import annotations

import math
from dataclasses import asdict, fields
from typing import Any, TypeVar

from .records import FailureRecord, FirstFailure, RequestRecord
from .report_data import ReportData
from .reuse import FIELDS

__all__ = ["FORMAT", "report_from_json", "report_to_json"]

FORMAT = "pytest-prefixcache/report/v2"

R = TypeVar("R", bound=ReportData)


def _finite(x: float) -> float | str:
    """JSON has no inf or NaN: write them as strings."""
    return x if math.isfinite(x) else str(x)


def _number(x: Any) -> float:
    return float(x) if isinstance(x, (int, float, str)) else 0.0


def report_to_json(report: ReportData) -> dict[str, Any]:
    """``report`` as JSON data: every figure finite or a string, its failures and records."""
    return {
        "format": FORMAT,
        "seed": report.seed,
        "shards": report.shards,
        "parallel_streams": report.parallel_streams,
        "engine": report.engine,
        "model": report.model,
        "tolerance": report.tolerance,
        "decode_rule": report.decode_rule,
        "decode_rule_requests": report.decode_rule_requests,
        "workers": report.workers,
        "streams": report.streams,
        "requests": report.requests,
        "cache_hits": report.cache_hits,
        "reused_tokens": report.reused_tokens,
        "oracle_tokens": report.oracle_tokens,
        "over_claims": report.over_claims,
        "shrink_examples": report.shrink_examples,
        "shrink_skipped": report.shrink_skipped,
        "efficiency": report.efficiency,
        **{name: getattr(report, name) for name in FIELDS},
        "worst_diff": _finite(report.worst_diff),
        "worst_diff_where": report.worst_diff_where,
        "worst_kl": _finite(report.worst_kl),
        "merges_checked": report.merges_checked,
        "claims_checked": report.claims_checked,
        "steps_aligned": report.steps_aligned,
        "warm_seconds": report.warm_seconds,
        "cold_seconds": report.cold_seconds,
        "warm_first_token": report.warm_first_token,
        "cold_first_token": report.cold_first_token,
        "untimed_hits": report.untimed_hits,
        "speedup_measure": report.speedup_measure,
        "speedup_not_measured": report.speedup_not_measured,
        "engine_error": report.engine_error,
        "server": report.server,
        "failures_by_check": report.failures_by_check,
        "verdict": report.verdict,
        "findings": report.findings,
        "finding_examples": report.finding_examples,
        "skipped": report.skipped,
        "allow_partial": report.allow_partial,
        "coverage": report.coverage,
        "not_checked": report.not_checked,
        **({"configs": report.configs} if report.configs else {}),
        "run": report.run,
        "run_file": report.run_file,
        "first_failure": None if report.first_failure is None else asdict(report.first_failure),
        "slowest_call": report.slowest_call,
        "failures": [asdict(f) for f in report.failures],
        "records_dropped": report.records_dropped,
        "records": [
            {k: _finite(v) if isinstance(v, float) else v for k, v in asdict(r).items()}
            for r in report.records
        ],
    }


def report_from_json(cls: type[R], data: dict[str, Any]) -> R:
    """The ``cls`` report :func:`report_to_json` wrote (older files without records load too);
    ValueError when ``data`` is not a report."""
    if not isinstance(data, dict) or "requests" not in data:
        raise ValueError("not a pytest-prefixcache report (no 'requests' field)")
    scalars = {f.name for f in fields(cls)} - {"failures", "records", "first_failure"}
    out = cls(**{k: data[k] for k in scalars if k in data})
    first = data.get("first_failure")
    if isinstance(first, dict):
        keys = {f.name for f in fields(FirstFailure)}
        out.first_failure = FirstFailure(**{k: v for k, v in first.items() if k in keys})
    for name in ("worst_diff", "worst_kl"):
        setattr(out, name, _number(getattr(out, name)))
    fail_keys = {f.name for f in fields(FailureRecord)}
    out.failures = [
        FailureRecord(**{k: v for k, v in f.items() if k in fail_keys})
        for f in data.get("failures", [])
    ]
    rec_keys = {f.name for f in fields(RequestRecord)}
    out.records = []
    for r in data.get("records", []):
        values = {k: v for k, v in r.items() if k in rec_keys}
        values["diff"] = _number(values.get("diff", 0.0))
        values["kl"] = _number(values.get("kl", 0.0))
        out.records.append(RequestRecord(**values))
    return out
