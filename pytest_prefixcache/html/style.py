"""The report page's stylesheet, inlined into the page (no external fonts or files)."""

from __future__ import annotations

__all__ = ["CSS"]

CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #f6f8fa; --card: #fff;
  --pass: #1a7f37; --fail: #cf222e; --warn: #9a6700; --blue: #3b72c9; --grey: #c9d3de;
  --orange: #d4862b; --mono: ui-monospace, "SFMono-Regular", "DejaVu Sans Mono", Menlo,
  Consolas, monospace; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg); font: 15px/1.45 system-ui,
  -apple-system, "Segoe UI", Roboto, "Noto Sans", "DejaVu Sans", sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 24px 20px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 0 0 8px; }
h3 { font-size: 16px; margin: 0; }
code, pre, .mono { font-family: var(--mono); font-size: 13px; }
pre { background: #f6f8fa; border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px;
  overflow-x: auto; white-space: pre-wrap; word-break: break-word; margin: 6px 0 12px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px;
  padding: 16px 18px; margin: 16px 0; }
.muted { color: var(--muted); }
.header { display: flex; gap: 16px; align-items: center; flex-wrap: wrap; }
.header .title { flex: 1 1 400px; min-width: 0; }
.header .engine { font-family: var(--mono); font-size: 14px; word-break: break-all; }
.verdict { font-size: 20px; font-weight: 700; padding: 8px 18px; border-radius: 8px;
  color: #fff; letter-spacing: .04em; }
.verdict.pass { background: var(--pass); }
.verdict.fail { background: var(--fail); }
.verdict.empty { background: var(--warn); }
.stats { display: grid; grid-template-columns: repeat(5, 1fr); gap: 10px; margin-top: 14px; }
@media (max-width: 820px) { .stats { grid-template-columns: repeat(2, 1fr); } }
.stat { border: 1px solid var(--line); border-radius: 6px; padding: 8px 10px; }
.stat .label { color: var(--muted); font-size: 12px; text-transform: uppercase;
  letter-spacing: .04em; }
.stat .value { font-size: 18px; font-weight: 600; }
.stat .detail { color: var(--muted); font-size: 12px; word-break: break-word; }
.stat.wide { grid-column: span 2; }
.stat.seed .detail { font-family: var(--mono); }
.stat.bad .value { color: var(--fail); }
.stat.good .value { color: var(--pass); }
.note { background: #fff8c5; border: 1px solid #e9d36b; border-radius: 6px; padding: 6px 10px;
  margin: 6px 0; font-size: 13px; }
.error { background: #ffebe9; border-color: #ffb3ad; }
svg.chart { width: 100%; height: auto; display: block; }
svg.chart text { font: 12px system-ui, "DejaVu Sans", sans-serif; fill: var(--fg); }
svg.chart .tick { fill: var(--muted); }
svg.chart .axis-title { font-weight: 600; }
svg.chart .grid { stroke: #eaeef2; }
svg.chart .axis-line, svg.chart .tick-mark { stroke: #8c959f; }
svg.chart .oracle { fill: var(--grey); }
svg.chart .reported { fill: var(--blue); }
svg.chart .over, svg.chart .over-marker { fill: var(--fail); }
svg.chart .zero { fill: var(--pass); }
svg.chart .pos { fill: var(--orange); }
svg.chart .over-tol, svg.chart .nonfinite { fill: var(--fail); }
svg.chart .count { fill: var(--fg); font-weight: 600; }
svg.chart .tol-line { stroke: var(--fg); stroke-dasharray: 4 3; }
svg.chart .empty { fill: var(--muted); font-size: 14px; }
svg.chart rect.bar:hover, svg.chart rect.bin:hover { opacity: .75; }
.caption { color: var(--muted); font-size: 13px; margin: 6px 0 0; }
.toc { margin: 4px 0 0; padding-left: 20px; }
table.configs { border-collapse: collapse; width: 100%; font-size: 13px; }
table.configs th, table.configs td { text-align: left; padding: 4px 8px;
  border-bottom: 1px solid var(--grey); vertical-align: top; }
table.configs td.good { color: var(--pass); font-weight: 700; }
table.configs td.bad { color: var(--fail); font-weight: 700; }
.failure { border-left: 5px solid var(--fail); }
.failure .head { display: flex; gap: 10px; align-items: baseline; flex-wrap: wrap; }
.failure .test { font-family: var(--mono); font-size: 14px; word-break: break-all; }
.failure .summary { font-weight: 600; margin: 8px 0; }
.badge { display: inline-block; font-size: 12px; font-weight: 600; border-radius: 10px;
  padding: 1px 9px; background: #eaeef2; color: var(--fg); }
.badge.fail { background: var(--fail); color: #fff; }
.badge.check { background: #ffebe9; color: var(--fail); border: 1px solid #ffb3ad; }
.section-label { font-size: 12px; font-weight: 600; color: var(--muted); text-transform: uppercase;
  letter-spacing: .04em; margin-top: 12px; }
.stream { display: flex; flex-direction: column; gap: 6px; margin-top: 6px; }
details.request { border: 1px solid var(--line); border-radius: 6px; background: #fbfcfd; }
details.request > summary { cursor: pointer; padding: 6px 10px; }
details.request.failing { border: 2px solid var(--fail); background: #fff; }
details.request.failing > summary { background: #ffebe9; }
.messages { padding: 4px 10px 10px; display: flex; flex-direction: column; gap: 6px; }
.msg { display: grid; grid-template-columns: 84px 1fr; gap: 8px; border-radius: 6px;
  padding: 6px 8px; }
.msg .role { font-size: 12px; font-weight: 700; text-transform: uppercase; color: var(--muted);
  padding-top: 2px; }
.msg .content { display: flex; flex-wrap: wrap; gap: 6px 12px; align-items: flex-start;
  min-width: 0; }
.msg .text { white-space: pre-wrap; word-break: break-word; flex-basis: 100%; }
.role-system { background: #f3f0ff; }
.role-user { background: #eef5ff; }
.role-assistant { background: #eefbf1; }
.role-other { background: #f6f8fa; }
figure.image { margin: 0; display: inline-flex; flex-direction: column; align-items: center; }
img.failure-image { height: auto; max-width: 100%; image-rendering: pixelated;
  border: 1px solid var(--line); border-radius: 4px; background: #fff; }
.thumbs { display: inline-flex; gap: 3px; vertical-align: middle; margin-left: 6px; }
img.thumb, .thumb.missing { height: 22px; width: auto; max-width: 66px;
  border: 1px solid var(--line); border-radius: 2px; image-rendering: pixelated; }
.thumb.missing { display: inline-block; width: 22px; text-align: center; font-size: 12px; }
figure.image figcaption { font-size: 11px; color: var(--muted); font-family: var(--mono); }
ul.lines { list-style: none; margin: 4px 0; padding: 0; font-family: var(--mono);
  font-size: 13px; }
ul.lines li { padding: 2px 0; word-break: break-word; }
ul.lines li.sub { padding-left: 24px; color: var(--muted); }
ul.lines li.bad { color: var(--fail); font-weight: 600; }
ul.lines li.good { color: var(--pass); }
table.coverage td.name { font-family: var(--mono); }
table.coverage tr.gap td { color: var(--fail); font-weight: 600; background: #ffebe9; }
footer { color: var(--muted); font-size: 12px; text-align: center; margin-top: 24px; }
"""
