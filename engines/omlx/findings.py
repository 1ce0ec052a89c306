"""oMLX's findings from a matrix run of engines/omlx/verify.sh.

``findings.py table RUN MATRIX VERSION``: a markdown table, one row per combination of the run
(``RUN/suite.json``: one ``configs`` row each; ``RUN/tap/<slug>.jsonl``: per request, the API's
vs the tap's reuse), for docs/engines.md.
``findings.py save RUN MATRIX CORPUS``: copy every failure's shrunk stream (stream.json + PNGs)
to ``CORPUS/omlx-<combination>-<check>[-n]/`` with a description naming the engine, version,
flags and what went wrong.
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

VERSION = "flyto-mlx 0.7.0"


def _targets(matrix: Path) -> dict[str, Any]:
    return {t.name: t for t in read_matrix(matrix)}


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


def _pct(part: int | None, whole: int | None) -> str:
    if not whole:
        return "n/a"
    return f"{100 * (part or 0) / whole:.1f}% ({part or 0:,} of {whole:,})"


def table(run: Path, matrix: Path, version: str) -> str:
    suite = json.loads((run / "suite.json").read_text())
    targets = _targets(matrix)
    lines = [
        "| combination | flags | verdict | requests (hits) | vs block reference | vs token "
        "oracle | reused, API / tap | worst diff | failures | findings |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in suite.get("configs", []):
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
        examples = [_short(f["summary"]) for f in c.get("failures", [])][:2]
        found = "; ".join(f"{k}: {v}" for k, v in sorted((c.get("findings") or {}).items()))
        size = c.get("block_size")
        lines.append(
            f"| `{c['name']}` | `{flags or 'no flags'}` | {c['verdict'].upper()} | "
            f"{c['requests']} ({c['cache_hits']}) | blocks of {size}: "
            f"{_pct(c.get('block_reused'), c.get('block_tokens'))} | "
            f"{_pct(c.get('reused_tokens'), c.get('oracle_tokens'))} | "
            f"{tap['api']:,} / {tap['tap']:,}{disagree} | "
            f"{c['worst_diff']:g} | {fails or 'none'}"
            f"{'<br>' + '<br>'.join(examples) if examples else ''} | {found or 'none'} |"
        )
    head = f"oMLX ({version}), {len(suite.get('configs', []))} combinations, seed 1"
    return f"{head}\n\n" + "\n".join(lines)


def save(run: Path, matrix: Path, corpus: Path) -> list[str]:
    suite = json.loads((run / "suite.json").read_text())
    targets = _targets(matrix)
    saved: list[str] = []
    seen: dict[str, str] = {}
    for c in suite.get("configs", []):
        t = targets.get(c["name"])
        flags = shlex.join(t.flags or ()) if t is not None else "?"
        for f in c.get("failures", []):
            source = Path(f.get("stream_dir") or "")
            if not (source / "stream.json").is_file() or str(source) in seen:
                continue
            base = "omlx-" + re.sub(r"[^a-z0-9]+", "-", f"{c['name']}-{f['check']}".lower())
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
                f"oMLX ({VERSION}), {c['name']} ({flags or 'no flags'}), found by "
                f"engines/omlx/verify.sh: {_short(f['summary'], 400)}"
            )
            data.update(engine="omlx", version=VERSION, mode=c["name"], check=f["check"])
            (target / "stream.json").write_text(json.dumps(data, indent=1) + "\n")
            saved.append(name)
    return saved


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "table":
        print(table(Path(argv[1]), Path(argv[2]), argv[3]))
        return 0
    if len(argv) == 4 and argv[0] == "save":
        for name in save(Path(argv[1]), Path(argv[2]), Path(argv[3])):
            print(f"saved {Path(argv[3]) / name}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
