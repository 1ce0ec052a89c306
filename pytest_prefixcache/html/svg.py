"""Small SVG helpers for the report's charts: a plot frame with nice ticks, axes and a legend.

Every chart is an inline ``<svg>`` drawn with a ``viewBox`` so that it scales with the page;
colours come from CSS classes defined in :mod:`pytest_prefixcache.html.style`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["Frame", "fmt_count", "legend", "nice_ticks", "num"]


def num(x: float) -> str:
    """A coordinate, short: ``12.5``, ``3``."""
    return f"{x:.2f}".rstrip("0").rstrip(".") or "0"


def fmt_count(x: float) -> str:
    """An axis label for a count: ``0``, ``250``, ``1.5k``, ``20k``."""
    if abs(x) >= 10_000:
        return f"{x / 1000:g}k"
    return f"{x:g}"


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Ticks from 0 to at least ``top`` at a step of 1, 2 or 5 times a power of ten (whole
    numbers: the charts count tokens and requests)."""
    if not math.isfinite(top) or top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10.0 ** math.floor(math.log10(raw))
    step = max(1.0, next(m * power for m in (1, 2, 5, 10) if m * power >= raw))
    step = float(round(step))
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


@dataclass
class Frame:
    """The plot area of a chart ``width`` x ``height`` (viewBox units) with margins."""

    width: float = 960
    height: float = 300
    left: float = 64
    right: float = 16
    top: float = 50
    bottom: float = 48

    @property
    def plot_w(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> float:
        return self.height - self.top - self.bottom

    @property
    def base(self) -> float:
        """The y of the x axis."""
        return self.top + self.plot_h

    def y(self, value: float, top: float) -> float:
        """The y of ``value`` on a linear axis from 0 to ``top``."""
        return self.base - (value / top) * self.plot_h if top > 0 else self.base

    def open(self, chart_id: str, label: str, data: Mapping[str, object] | None = None) -> str:
        """The ``<svg>`` start tag and its title; ``data`` become ``data-*`` attributes."""
        attrs = "".join(f' data-{k}="{escape(str(v))}"' for k, v in (data or {}).items())
        return (
            f'<svg id="{chart_id}" class="chart"{attrs} viewBox="0 0 {num(self.width)} '
            f'{num(self.height)}" preserveAspectRatio="xMidYMid meet" role="img" '
            f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
            f"<title>{escape(label)}</title>"
        )

    def y_axis(self, ticks: Sequence[float], title: str) -> list[str]:
        """Grid lines, tick labels and the rotated axis title; ``ticks[-1]`` is the top."""
        top = ticks[-1]
        out = ['<g class="axis y-axis">']
        x0, x1 = num(self.left), num(self.left + self.plot_w)
        for t in ticks:
            y = num(self.y(t, top))
            out.append(f'<line class="grid" x1="{x0}" x2="{x1}" y1="{y}" y2="{y}"/>')
            out.append(
                f'<text class="tick" x="{num(self.left - 6)}" y="{y}" text-anchor="end" '
                f'dominant-baseline="middle">{fmt_count(t)}</text>'
            )
        cy = num(self.top + self.plot_h / 2)
        out.append(
            f'<text class="axis-title" x="14" y="{cy}" text-anchor="middle" '
            f'transform="rotate(-90 14 {cy})">{escape(title)}</text>'
        )
        out.append(
            f'<line class="axis-line" x1="{x0}" x2="{x0}" y1="{num(self.top)}" '
            f'y2="{num(self.base)}"/>'
        )
        out.append("</g>")
        return out

    def x_axis(self, ticks: Sequence[tuple[float, str]], title: str) -> list[str]:
        """The x axis line, ticks at the given x positions with labels, and the title."""
        base = num(self.base)
        out = [
            '<g class="axis x-axis">',
            f'<line class="axis-line" x1="{num(self.left)}" x2="{num(self.left + self.plot_w)}" '
            f'y1="{base}" y2="{base}"/>',
        ]
        for x, label in ticks:
            out.append(
                f'<line class="tick-mark" x1="{num(x)}" x2="{num(x)}" y1="{base}" '
                f'y2="{num(self.base + 5)}"/>'
            )
            out.append(
                f'<text class="tick" x="{num(x)}" y="{num(self.base + 18)}" '
                f'text-anchor="middle">{escape(label)}</text>'
            )
        out.append(
            f'<text class="axis-title" x="{num(self.left + self.plot_w / 2)}" '
            f'y="{num(self.height - 6)}" text-anchor="middle">{escape(title)}</text>'
        )
        out.append("</g>")
        return out


def legend(frame: Frame, items: Sequence[tuple[str, str]]) -> list[str]:
    """A one-row legend above the plot, right-aligned: ``(css class of the swatch, label)``."""
    widths = [26 + 7 * len(label) for _, label in items]
    x = frame.left + frame.plot_w - sum(widths)
    out = ['<g class="legend">']
    for (cls, label), w in zip(items, widths):
        out.append(
            f'<rect class="swatch {cls}" x="{num(x)}" y="6" width="12" height="12" rx="2"/>'
            f'<text x="{num(x + 17)}" y="12" dominant-baseline="middle">{escape(label)}</text>'
        )
        x += w
    out.append("</g>")
    return out
