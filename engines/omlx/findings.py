"""oMLX's findings from a matrix run of engines/omlx/verify.sh.

``findings.py table RUN MATRIX VERSION``: a markdown table, one row per combination of the run
(``RUN/<combination>/suite.json``: a matrix report with its ``configs`` row; ``RUN/tap/<slug>
.jsonl``: per request, the API's vs the tap's reuse), in the matrix file's order, for
docs/engines.md.
``findings.py save RUN MATRIX CORPUS``: copy every failure's shrunk stream (stream.json + PNGs)
to ``CORPUS/omlx-<labels>-<check>[-n]/`` (``omlx-qwen2-vl-ssd-b32-equivalence``) with a
description naming the engine, version, flags and what went wrong.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from pytest_prefixcache.adapters.omlx import model_dir, slug
from pytest_prefixcache.session.matrix_file import read_matrix

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # engines/: the lab package
from lab.command_line import Command, dispatch, saved_lines
from lab.findings import markdown, share

VERSION = "flyto-mlx 0.7.0"
COLUMNS = (
    "combination", "flags", "verdict", "requests (hits)", "vs block reference",
    "vs token oracle", "reused, API / tap", "worst diff", "failures", "findings",
)  # fmt: skip


def _targets(matrix: Path) -> dict[str, Any]:
    return {t.name: t for t in read_matrix(matrix)}


def _configs(run: Path, targets: dict[str, Any]) -> list[dict[str, Any]]:
    """Every combination's row of the run, in the matrix file's order."""
    rows = []
    for path in sorted(run.glob("*/suite.json")):
        rows += json.loads(path.read_text()).get("configs", [])
    order = {name: i for i, name in enumerate(targets)}
    return sorted(rows, key=lambda c: order.get(c["name"], len(order)))


def _tap(path: Path) -> dict[str, int]:
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    warm = [r for r in rows if r["use_cache"]]
    api = [r["api_cached_tokens"] or 0 for r in warm]
    tap = [r["tap_reused_tokens"] or 0 for r in warm]
    return {
        "prompt": sum(r["prompt_tokens"] or 0 for r in warm),
        "api": sum(api),
        "tap": sum(tap),
        "disagree": sum(a != t for a, t in zip(api, tap)),
        "cold": sum(r["tap_reused_tokens"] or 0 for r in rows if not r["use_cache"]),
    }


def _short(text: str, n: int = 140) -> str:
    text = re.sub(r"http://127\.0\.0\.1:\d+", "", text).replace("|", "\\|")
    return text[:n].rstrip() + ("..." if len(text) > n else "")


def table(run: Path, matrix: Path, version: str) -> str:
    targets = _targets(matrix)
    configs = _configs(run, targets)
    lines: list[str] = []
    for c in configs:
        t = targets.get(c["name"])
        flags = shlex.join(t.flags or ()) if t is not None else "?"
        if c.get("engine_error"):
            lines.append(
                f"| `{c['name']}` | `{flags}` | ERROR | | | | | | "
                f"{_short(str(c['engine_error']))} | |"
            )
            continue
        model = t.overrides.get("model") if t is not None else None
        flag_words = (t.flags or ()) if t is not None else ()
        tap = _tap(run / "tap" / f"{slug(flag_words, model_dir(model))}.jsonl")
        disagree = f" ({tap['disagree']} disagree)" if tap["disagree"] else ""
        fails = "; ".join(f"{k}: {v}" for k, v in sorted(c["failures_by_check"].items()))
        tests = [str(f.get("test") or "").rpartition("::")[2] for f in c.get("failures", [])]
        examples = sorted(
            {
                t.split("[")[0] + (f" ({t.split('[')[1].split('-omlx')[0]})" if "[" in t else "")
                for t in tests
                if t
            }
        )
        found = "; ".join(f"{k}: {v}" for k, v in sorted((c.get("findings") or {}).items()))
        size = c.get("block_size")
        lines.append(
            f"| `{c['name']}` | `{flags or 'no flags'}` | {c['verdict'].upper()} | "
            f"{c['requests']} ({c['cache_hits']}) | blocks of {size}: "
            f"{share(c.get('block_reused'), c.get('block_tokens'))} | "
            f"{share(c.get('reused_tokens'), c.get('oracle_tokens'))} | "
            f"{tap['api']:,} / {tap['tap']:,}{disagree} | "
            f"{c['worst_diff']:g} | {fails or 'none'}"
            f"{': ' + ', '.join(examples) if examples else ''} | {found or 'none'} |"
        )
    head = f"oMLX ({version}), {len(configs)} combinations, seed 1"
    return f"{head}\n\n" + markdown(COLUMNS, lines)


def save(run: Path, matrix: Path, corpus: Path) -> list[str]:
    targets = _targets(matrix)
    saved: list[str] = []
    seen: dict[str, str] = {}
    for c in _configs(run, targets):
        t = targets.get(c["name"])
        flags = shlex.join(t.flags or ()) if t is not None else "?"
        for f in c.get("failures", []):
            source = Path(f.get("stream_dir") or "")
            if not (source / "stream.json").is_file() or str(source) in seen:
                continue
            mode = c["name"].removeprefix("omlx-").replace("[", ",").rstrip("]")
            base = "omlx-" + re.sub(r"[^a-z0-9]+", "-", f"{mode}-{f['check']}".lower())
            name, n = base.strip("-"), 2
            while name in saved:
                name, n = f"{base}-{n}", n + 1
            seen[str(source)] = name
            target = corpus / name
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(source, target)
            data = json.loads((target / "stream.json").read_text())
            data["description"] = (
                f"omlx {VERSION.split()[-1]} ({VERSION}, oMLX's server on PyPI), {c['name']} "
                f"({flags or 'no flags'}), found by engines/omlx/verify.sh: "
                f"{_short(f['summary'], 400)}"
            )
            version = VERSION.split()[-1]
            data.update(engine="omlx", version=version, mode=mode, check=f["check"])
            (target / "stream.json").write_text(json.dumps(data, indent=1) + "\n")
            saved.append(name)
    return saved


def main(argv: list[str]) -> int:
    commands = {
        "table": Command({3}, lambda a: [table(Path(a[0]), Path(a[1]), a[2])]),
        "save": Command(
            {3}, lambda a: saved_lines(Path(a[2]), save(Path(a[0]), Path(a[1]), Path(a[2])))
        ),
    }
    return dispatch(argv, commands, __doc__ or "")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
