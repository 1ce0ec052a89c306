"""Claim sources: the places a server reports reuse, and reading a figure out of each.

- :class:`ApiField`: a dotted path into the reply (``usage.prompt_tokens_details.cached_tokens``,
  llama-server's ``timings.cache_n``); absent means the API said nothing.
- :class:`StatsDelta`: a JSON stats endpoint read before and after the request; the claim is
  the change of one dotted field (``/v1/cache/stats`` ``hits``); ``optional``: a server that
  has no such field (a cache-less baseline whose stats say ``null``) claims nothing.
- :class:`MetricDelta`: a Prometheus counter (``/metrics``), summed over its samples whose
  labels contain ``labels``, before and after; no sample after the request: the server has no
  such counter and claims nothing (no sample before only: a counter that starts at 0).
- :class:`LogPattern`: a regular expression over the lines the server logged during the
  request: with a group, the group's numbers summed; without one, the matches counted. No line
  claims 0.
- :class:`Header`: a reply header: a number, or ``hit``/``true``/``miss``/``false``.

:func:`sources_from_json` reads a list of them (``PREFIXCACHE_CLAIMS``); :mod:`.claims` reads
them around each request.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import EngineError
from ...types import ClaimUnit

__all__ = [
    "UNITS",
    "ApiField",
    "Header",
    "LogPattern",
    "MetricDelta",
    "Source",
    "StatsDelta",
    "dotted",
    "excerpt",
    "metric_sum",
    "number",
    "sources_from_json",
    "sources_from_specs",
]

#: The values of :data:`~pytest_prefixcache.types.ClaimUnit`.
UNITS = ("tokens", "hits", "misses")


@dataclass(frozen=True)
class ApiField:
    """A figure in the reply's JSON, at a dotted path."""

    path: str = "usage.prompt_tokens_details.cached_tokens"
    unit: ClaimUnit = "tokens"

    @property
    def name(self) -> str:
        return f"API {self.path}"


@dataclass(frozen=True)
class StatsDelta:
    """The change of a dotted field of a JSON stats endpoint across the request."""

    path: str
    field: str
    unit: ClaimUnit = "hits"
    method: str = "GET"
    optional: bool = False
    """An absent field says nothing (else it is an error naming the reply)."""

    @property
    def name(self) -> str:
        return f"stats {self.method} {self.path} {self.field} (delta)"


@dataclass(frozen=True)
class MetricDelta:
    """The change of a Prometheus counter across the request."""

    metric: str
    unit: ClaimUnit = "tokens"
    path: str = "/metrics"
    labels: str = ""

    @property
    def name(self) -> str:
        return f"metric {self.metric}{'{' + self.labels + '}' if self.labels else ''} (delta)"


@dataclass(frozen=True)
class LogPattern:
    """Lines of the server's log written during the request that match ``pattern``."""

    pattern: str
    unit: ClaimUnit = "hits"
    path: str | None = None
    """The log file; default: the log of the server started here."""

    @property
    def name(self) -> str:
        return f"log /{self.pattern}/"


@dataclass(frozen=True)
class Header:
    """A reply header."""

    header: str
    unit: ClaimUnit = "hits"

    @property
    def name(self) -> str:
        return f"header {self.header}"


Source = ApiField | StatsDelta | MetricDelta | LogPattern | Header


#: ``sources_from_json``: the key naming each kind of source, and its class.
_KINDS: dict[str, Any] = {
    "api": ApiField,
    "stats": StatsDelta,
    "metric": MetricDelta,
    "log": LogPattern,
    "header": Header,
}


def sources_from_json(text: str) -> list[Source]:
    """Claim sources from JSON (``PREFIXCACHE_CLAIMS``): a list of objects, each with one kind
    key (``api``, ``stats``, ``metric``, ``log``, ``header``) whose value is the path, metric,
    pattern or header name, and the class's other fields (``field``, ``unit``, ``labels``,
    ``method``, ``path``, ``optional``). Example:
    ``[{"api": "usage.prompt_tokens_details.cached_tokens"}, {"stats": "/v1/cache/stats",
    "field": "hits"}, {"metric": "vllm:prefix_cache_hits_total"}]``."""
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise EngineError(f"claim sources {text[:200]!r}: {exc}") from None
    return sources_from_specs(items, text)


def sources_from_specs(items: Any, text: str | None = None) -> list[Source]:
    """Claim sources from the parsed form of :func:`sources_from_json`'s list (a preset's own
    specs); errors name ``text``, else the list as JSON."""
    try:
        if not isinstance(items, list):
            raise ValueError("not a list")
        out = []
        for item in items:
            [kind] = [k for k in item if k in _KINDS]
            cls = _KINDS[kind]
            first = dataclasses.fields(cls)[0].name
            rest = {k: v for k, v in item.items() if k != kind}
            out.append(cls(**{first: item[kind]}, **rest))
    except (ValueError, TypeError, AttributeError) as exc:
        shown = json.dumps(items, default=str) if text is None else text
        raise EngineError(f"claim sources {shown[:200]!r}: {exc}") from None
    return out


def dotted(data: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(data, Mapping) or key not in data:
            return None
        data = data[key]
    return data


def number(value: Any) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return round(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("hit", "true", "yes"):
            return 1
        if word in ("miss", "false", "no"):
            return 0
        try:
            return round(float(word))
        except ValueError:
            return None
    return None


def metric_sum(text: str, name: str, labels: str) -> float | None:
    """The sum of a Prometheus metric's samples whose label set contains ``labels``; None
    when there is no such sample (a server without the counter, such as llama.cpp build 10068's
    llama-server without ``llamacpp:prompt_tokens_cached_total``, says nothing: not 0)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric.strip() != name or labels not in rest:
            continue
        try:
            total += float(value)
        except ValueError:
            continue
        seen = True
    return total if seen else None


def excerpt(text: str, s: StatsDelta | MetricDelta) -> str:
    """The part of a stats or metrics reply worth quoting in a failure."""
    if isinstance(s, MetricDelta):
        lines = [line for line in text.splitlines() if line.startswith(s.metric)]
        return " | ".join(lines)[:200] or f"no {s.metric} sample"
    return text[:200]
