"""The rows of llama-server's matrix (engines/llama/matrix.toml), their table and their saved
counterexamples (used by ``engines/llama/run.sh matrix``).

``run.sh matrix`` runs each combination in its own directory ``$LLAMA_REPORTS/run-<name>/``
(``suite.json``: the plugin's report of a ``--prefixcache-matrix`` run of that one
combination, its ``configs`` row; ``.prefixcache/failures/``: the failures' shrunk streams).

    python engines/llama/matrix_findings.py row REPORTS RUN MATRIX VERSION [EXAMPLES [TAG]]
                          writes REPORTS/matrix-<name>[-TAG]/row.json for each configs row of
                          RUN (TAG: a partial pass, e.g. "waves": test_waves alone)
    python engines/llama/matrix_findings.py table REPORTS     prints the Markdown table
    python engines/llama/matrix_findings.py save REPORTS CORPUS
                          copies each failure's shrunk counterexample into CORPUS (not the
                          "off" combination's: prompt caching off is the negative control)
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # engines/: the lab package, also when loaded by path
from lab.command_line import Command, dispatch, row_lines, saved_lines, table_lines  # noqa: E402
from lab.findings import (  # noqa: E402 (after the path)
    efficiency,
    failure_entries,
    markdown,
    matrix_targets,
    save,
    slug,
    suite_row,
)

SCRIPT = "engines/llama/run.sh matrix"
ENGINE = "llama-server"
#: The combinations whose failures are controls, not findings about the engine.
CONTROLS = ("llama-off[off]",)
COLUMNS = (
    "combination", "flags", "examples", "requests (hits)", "efficiency vs oracle",
    "worst diff (atol)", "claims", "waves", "failures",
)  # fmt: skip


def rows(
    reports: Path, run: Path, matrix: Path, version: str, examples: str = "", tag: str = ""
) -> list[dict[str, Any]]:
    """One row per configuration of the report in ``run``, written to
    ``reports/matrix-<slug>/row.json`` with its flags, its place in ``matrix`` and the examples
    per property it ran with."""
    targets = matrix_targets(matrix)
    suite = json.loads((run / "suite.json").read_text())
    out = []
    for config in suite.get("configs") or [suite]:
        name = config.get("name") or ""
        order, target = targets[name]
        directory = reports / f"matrix-{slug(name)}{'-' + tag if tag else ''}"
        directory.mkdir(parents=True, exist_ok=True)
        # a tagged pass's mode names the tag, so its counterexamples get folders of their own
        r = suite_row(config, directory, ENGINE, version, f"{name} {tag}" if tag else name, {})
        r.update(order=order, flags=shlex.join(target.flags or ()), examples=examples)
        r.update(tolerance=config.get("tolerance"), waves=_waves(config), run=run.name)
        coverage = config.get("coverage") or {}
        r.update(verdict=config.get("verdict"), tag=tag, claims=_claims(coverage))
        r.update(concurrent=sum((coverage.get("concurrent") or {}).values()))
        (directory / "row.json").write_text(json.dumps(r, indent=1) + "\n")
        out.append(r)
    return out


def _claims(coverage: dict[str, Any]) -> str:
    """``compared`` (claim sources declared: compared with each other, there is no tap) or
    ``off`` (none declared: the combination serves concurrent requests)."""
    reasons = coverage.get("claims") or {}
    return "off" if not reasons or "no claim sources declared" in reasons else "compared"


def _waves(config: dict[str, Any]) -> str:
    """Whether test_waves ran: ``skipped`` (no concurrent service declared) or ``ran``."""
    skipped = [s for s in config.get("skipped") or [] if "test_waves[" in s]
    return "skipped" if skipped else "ran"


def _rows(reports: Path) -> list[dict[str, Any]]:
    found = [json.loads(p.read_text()) for p in reports.glob("matrix-*/row.json")]
    return sorted(
        found, key=lambda r: (r["mode"].split("[")[0], r.get("order", 0), r.get("tag") or "")
    )


def table(reports: Path, corpus_link: str = "fixtures/corpus/third_party") -> str:
    lines: list[str] = []
    for r in _rows(reports):
        flags = f"`{r['flags']}`" if r["flags"] else "no flags"
        tag = f" ({r['tag']} only)" if r.get("tag") else ""
        head = f"| `{r['mode'].split(' ')[0]}`{tag} | {flags} | {r.get('examples') or '?'} |"
        if not r["suite_ran"]:
            why = str(r.get("engine_error") or "the suite did not run")[:120]
            lines.append(f"{head} {why} | | | | | |")
            continue
        eff_text = efficiency(r, missing="not judged")
        atol = str(r.get("tolerance") or "").split(",")[0].removeprefix("atol=")
        claims = "compared (3 sources, no tap)" if r.get("claims") == "compared" else "off"
        waves = r["waves"]
        if waves == "ran":
            waves += f" ({r.get('concurrent') or 0} requests in waves)"
        failures = failure_entries(r, corpus_link, lambda f: True) or "none"
        lines.append(
            f"{head} {r['requests']} ({r['cache_hits']}) | {eff_text} | "
            f"{r['worst_diff']:.2g} ({atol}) | {claims} | {waves} | {failures} |"
        )
    return markdown(COLUMNS, lines)


def main(argv: list[str]) -> int:
    def write_rows(a: list[str]) -> Iterator[str]:
        examples, tag = [*a[4:], "", ""][:2]
        found = rows(Path(a[0]), Path(a[1]), Path(a[2]), a[3], examples, tag)
        return row_lines(found, ("mode", "requests", "efficiency", "verdict"))

    def save_findings(a: list[str]) -> Iterator[str]:
        for path in sorted(Path(a[0]).glob("matrix-*/row.json")):
            if json.loads(path.read_text())["mode"] in CONTROLS:
                continue
            pattern = f"{path.parent.name}/row.json"
            yield from saved_lines(Path(a[1]), save(Path(a[0]), Path(a[1]), pattern, SCRIPT))

    commands = {
        "row": Command({4, 5, 6}, write_rows),
        "table": table_lines(table),
        "save": Command({2}, save_findings),
    }
    return dispatch(argv, commands, __doc__ or "")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
