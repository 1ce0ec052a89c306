"""The report's two charts as inline SVG: reuse per request against the oracle, and the
distribution of cached-vs-uncached logit differences."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from ..output.report import RequestRecord
from .svg import Frame, legend, nice_ticks, num

__all__ = ["MAX_BARS", "DiffBin", "diff_bins", "diff_chart", "reuse_chart"]

#: Requests drawn one bar each; longer runs are grouped, each bar the maximum of its group.
MAX_BARS = 1500
#: Decades of the difference histogram; smaller differences fall into the first bin.
MAX_DECADES = 14


@dataclass
class _Slot:
    first: int
    last: int
    reported: int | None
    oracle: int | None
    over: int
    prompt: int | None

    def tooltip(self, records: Sequence[RequestRecord]) -> str:
        if self.first == self.last:
            r = records[self.first]
            where = f"#{self.first}: stream {r.stream}, request {r.request}"
            if r.worker:
                where += f" ({r.worker})"
            extra = [] if r.snapshot is None else [f"snapshot-aware {r.snapshot}"]
            extra += [] if r.block is None else [f"whole blocks {r.block}"]
            others = f" ({', '.join(extra)})" if extra else ""
            return (
                f"{where}: reported {_int(r.cached_tokens)} cached, oracle maximum "
                f"{_int(r.reusable)}{others}, prompt {_int(r.prompt_tokens)} tokens"
                + (" - MORE THAN THE ORACLE ALLOWS" if self.over else "")
            )
        return (
            f"#{self.first}-#{self.last}: at most {_int(self.reported)} reported, oracle "
            f"maximum up to {_int(self.oracle)}; {self.over} request(s) above the oracle"
        )


def _int(x: int | None) -> str:
    return "?" if x is None else str(x)


def _max(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _slots(records: Sequence[RequestRecord], group: int) -> list[_Slot]:
    out = []
    for start in range(0, len(records), group):
        chunk = records[start : start + group]
        out.append(
            _Slot(
                first=start,
                last=start + len(chunk) - 1,
                reported=_max([r.cached_tokens for r in chunk]),
                oracle=_max([r.reusable for r in chunk]),
                over=sum(r.over for r in chunk),
                prompt=_max([r.prompt_tokens for r in chunk]),
            )
        )
    return out


def reuse_chart(records: Sequence[RequestRecord]) -> str:
    """Per request, in run order: the oracle's maximum (grey) behind the reported reuse (blue,
    red and flagged above the plot where it exceeds the oracle)."""
    frame = Frame(height=320)
    group = max(1, math.ceil(len(records) / MAX_BARS))
    slots = _slots(records, group)
    over = sum(s.over for s in slots)
    data = {"requests": len(records), "bars": len(slots), "group": group, "over": over}
    out = [frame.open("chart-reuse", "Reused prompt tokens per request vs the oracle", data)]
    top = max([1, *(s.reported or 0 for s in slots), *(s.oracle or 0 for s in slots)])
    ticks = nice_ticks(top)
    out += frame.y_axis(ticks, "prompt tokens")
    slot_w = frame.plot_w / max(1, len(slots))
    bar_w = slot_w * 0.8 if slot_w >= 4 else slot_w
    out.append('<g class="bars">')
    for i, s in enumerate(slots):
        x = num(frame.left + i * slot_w + (slot_w - bar_w) / 2)
        tip = f"<title>{escape(s.tooltip(records))}</title>"
        if s.oracle is not None:
            y = frame.y(s.oracle, ticks[-1])
            out.append(
                f'<rect class="bar oracle" x="{x}" y="{num(y)}" width="{num(bar_w)}" '
                f'height="{num(frame.base - y)}">{tip}</rect>'
            )
        if s.reported is not None:
            y = frame.y(s.reported, ticks[-1])
            cls = "bar reported over" if s.over else "bar reported"
            out.append(
                f'<rect class="{cls}" x="{x}" y="{num(y)}" width="{num(bar_w)}" '
                f'height="{num(frame.base - y)}">{tip}</rect>'
            )
    out.append("</g>")
    out.append('<g class="over-markers">')
    for i, s in enumerate(slots):
        if s.over:
            cx = frame.left + (i + 0.5) * slot_w
            ty = frame.top - 3
            out.append(
                f'<path class="over-marker" d="M{num(cx - 4)} {num(ty - 7)}H{num(cx + 4)}'
                f'L{num(cx)} {num(ty)}Z"/>'
            )
    out.append("</g>")
    if not records:
        out.append(_empty(frame, "no per-request records in this report"))
    x_ticks = [
        (frame.left + t / group * slot_w, f"{t:g}")
        for t in nice_ticks(max(1, len(records)), 8)
        if t <= len(records)
    ]
    unit = "request" if group == 1 else f"request (one bar per {group} requests, the maximum)"
    out += frame.x_axis(x_ticks, f"{unit}, in run order")
    out += legend(
        frame,
        [
            ("oracle", "oracle maximum"),
            ("reported", "reported cached"),
            ("over", "reported > oracle"),
        ],
    )
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True)
class DiffBin:
    """One bar of the difference histogram: ``lo <= diff < hi`` (``kind`` zero, log or
    nonfinite)."""

    kind: str
    lo: float
    hi: float
    count: int

    @property
    def label(self) -> str:
        if self.kind == "zero":
            return "exactly 0"
        if self.kind == "nonfinite":
            return "NaN or infinite"
        lo = "0" if self.lo == 0 else _power(self.lo)
        return f"{lo} <= diff < {_power(self.hi)}"


_SUPER = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _power(x: float) -> str:
    """``10`` to a power, with a superscript exponent: ``10⁻³``."""
    k = round(math.log10(x))
    return "1" if k == 0 else "10" + str(k).translate(_SUPER)


def diff_bins(diffs: Sequence[float]) -> list[DiffBin]:
    """A bin for exactly 0, one per decade from the smallest to the largest positive difference
    (at most :data:`MAX_DECADES`; smaller ones join the first), and one for NaN and infinity."""
    zero = sum(1 for d in diffs if d == 0)
    bad = sum(1 for d in diffs if not math.isfinite(d))
    positive = [abs(d) for d in diffs if math.isfinite(d) and d != 0]
    bins = [DiffBin("zero", 0.0, 0.0, zero)]
    if positive:
        k_max = math.floor(math.log10(max(positive)))
        k_min = max(math.floor(math.log10(min(positive))), k_max - MAX_DECADES + 1)
        counts = [0] * (k_max - k_min + 1)
        for d in positive:
            counts[min(max(math.floor(math.log10(d)) - k_min, 0), len(counts) - 1)] += 1
        for i, c in enumerate(counts):
            lo = 10.0 ** (k_min + i)
            bins.append(DiffBin("log", lo if i or min(positive) >= lo else 0.0, lo * 10, c))
    if bad:
        bins.append(DiffBin("nonfinite", math.inf, math.inf, bad))
    return bins


def _tol(tolerance: str, name: str) -> float | None:
    """``atol`` or ``rtol`` out of a tolerance description (``atol=0.001, rtol=0``)."""
    m = re.search(name + r"=([0-9.eE+-]+)", tolerance)
    try:
        return float(m.group(1)) if m else None
    except ValueError:
        return None


def _bin_class(b: DiffBin, tolerance: str) -> str:
    """Red for differences that certainly fail (any above 0 at the exact tolerance, above atol
    when rtol is 0), orange for the rest above 0."""
    if b.kind != "log":
        return b.kind
    if tolerance.strip() == "exact":
        return "over-tol"
    atol = _tol(tolerance, "atol")
    certain = atol is not None and not _tol(tolerance, "rtol") and b.lo >= atol
    return "over-tol" if certain else "pos"


def diff_chart(records: Sequence[RequestRecord], tolerance: str) -> str:
    """A histogram of each request's worst |cached - uncached| logit difference: a bar for
    exactly 0 and log-scale bins above it."""
    frame = Frame(height=300)
    bins = diff_bins([r.diff for r in records])
    data = {"requests": len(records), "bins": len(bins)}
    out = [frame.open("chart-diff", "Distribution of worst logit differences per request", data)]
    ticks = nice_ticks(max([1, *(b.count for b in bins)]))
    out += frame.y_axis(ticks, "requests")
    logs = [b for b in bins if b.kind == "log"]
    units = 1 + (0.6 + len(logs) if logs else 0) + (1.6 if bins[-1].kind == "nonfinite" else 0)
    unit = min(frame.plot_w / units, 130.0)
    x_ticks: list[tuple[float, str]] = []
    placed: list[tuple[DiffBin, float]] = [(bins[0], frame.left)]
    x = frame.left + unit * 1.6
    for b in logs:
        placed.append((b, x))
        x_ticks.append((x, "" if b.lo == 0 else _power(b.lo)))
        x += unit
    if logs:
        x_ticks.append((x, _power(logs[-1].hi)))
    if bins[-1].kind == "nonfinite":
        placed.append((bins[-1], x + unit * 0.6))
    out.append('<g class="bins">')
    for b, bx in placed:
        pad = unit * 0.08
        y = frame.y(b.count, ticks[-1])
        if b.count:
            y = min(y, frame.base - 2)  # a count of 1 in 1,000 stays visible
        cls = _bin_class(b, tolerance)
        cx = num(bx + unit / 2)
        out.append(
            f'<rect class="bin {cls}" data-count="{b.count}" x="{num(bx + pad)}" y="{num(y)}" '
            f'width="{num(unit - 2 * pad)}" height="{num(frame.base - y)}">'
            f"<title>{escape(b.label)}: {b.count} request(s)</title></rect>"
            f'<text class="count" x="{cx}" y="{num(y - 5)}" text-anchor="middle">{b.count}</text>'
        )
        if b.kind != "log":
            label = "0" if b.kind == "zero" else "NaN/inf"
            x_ticks.append((bx + unit / 2, label))
    out.append("</g>")
    atol = _tol(tolerance, "atol")
    start = logs[-1].hi / 10.0 ** len(logs) if logs else 0.0
    if atol and logs and start <= atol < logs[-1].hi:
        ax = frame.left + unit * 1.6 + math.log10(atol / start) * unit
        out.append(
            f'<line class="tol-line" x1="{num(ax)}" x2="{num(ax)}" y1="{num(frame.top)}" '
            f'y2="{num(frame.base)}"/><text class="tol-label" x="{num(ax + 4)}" '
            f'y="{num(frame.top + 10)}">atol {atol:g}</text>'
        )
    if not records:
        out.append(_empty(frame, "no per-request records in this report"))
    out += frame.x_axis(x_ticks, "worst |cached - uncached| logit difference of a request")
    classes = {_bin_class(b, tolerance) for b in logs}
    if tolerance.strip() == "exact":
        swatches = [("over-tol", "above 0 (fails at exact tolerance)")]
    else:
        swatches = [("pos", "above 0")] + [("over-tol", "above atol")] * ("over-tol" in classes)
    if bins[-1].kind == "nonfinite":
        swatches.append(("nonfinite", "NaN or infinite"))
    out += legend(frame, [("zero", "exactly 0"), *swatches])
    out.append("</svg>")
    return "".join(out)


def _empty(frame: Frame, text: str) -> str:
    return (
        f'<text class="empty" x="{num(frame.left + frame.plot_w / 2)}" '
        f'y="{num(frame.top + frame.plot_h / 2)}" text-anchor="middle">{escape(text)}</text>'
    )
