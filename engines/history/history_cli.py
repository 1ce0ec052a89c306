"""The public record's command line (engines/history/run.sh calls it).

history_cli.py check            the catalogue's entries, checked (exit 2 naming the bad one)
history_cli.py run NAME|all     install and run both versions of an entry, or every runnable one
                            (HISTORY_EXAMPLES: the example budget, default the entry's)
history_cli.py table            regenerate docs/public-record.md from the catalogue and results/
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
for path in (HERE, ROOT):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from history_catalogue import Bug, CatalogueError, load, plugin_checks  # noqa: E402
from history_runner import RESULTS, run_bug  # noqa: E402
from history_table import DOC, load_results, render  # noqa: E402

USAGE = __doc__ or ""


def catalogue() -> list[Bug]:
    return load(plugin_checks(ROOT / "pytest_prefixcache"))


def main(argv: list[str]) -> int:
    if (
        not argv
        or argv[0] not in ("check", "run", "table")
        or (argv[0] == "run") != (len(argv) == 2)
    ):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        bugs = catalogue()
    except CatalogueError as exc:
        print(f"engines/history/bugs.toml: {exc}", file=sys.stderr)
        return 2
    if argv[0] == "check":
        print(f"{len(bugs)} entries, {sum(b.runs for b in bugs)} runnable")
        return 0
    if argv[0] == "table":
        DOC.write_text(render(bugs, load_results(RESULTS)))
        print(f"wrote {DOC}")
        return 0
    chosen = (
        [b for b in bugs if b.runs] if argv[1] == "all" else [b for b in bugs if b.name == argv[1]]
    )
    if not chosen:
        names = ", ".join(b.name for b in bugs if b.runs)
        print(f"no runnable entry named {argv[1]!r} (runnable: {names})", file=sys.stderr)
        return 2
    examples = int(os.environ.get("HISTORY_EXAMPLES", "0") or 0)
    for bug in chosen:
        run_bug(bug, examples)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
