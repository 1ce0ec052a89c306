"""At which example budget does the suite catch the block-manager harness's planted
unchained hash (``tests/block_manager_standin.py``: ``UnchainedHash``), seed by seed?

    python benchmarks/harness_control_budget.py --seeds 0 1 2 3 4 5 6 7 8 9 --budgets 5 10 20 40

Each (seed, budget) runs what ``tests/test_block_manager_harness.py``'s negative control runs:
``pytest --prefixcache-verify --pyargs pytest_prefixcache.suite`` on
``reference_engine.harness:from_env`` with the stand-in's ``UnchainedHash`` and ``Scheduler``,
64 blocks, ``--prefixcache-examples=BUDGET --prefixcache-seed=SEED``, in a fresh temporary
directory (no example database, no saved failures carried over). The budgets of a seed run in
the order given and stop at the first that catches it (an equivalence failure), unless
``--all``. Prints one line per run and writes every row to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENV = {
    "PREFIXCACHE_BLOCK_MANAGER": "block_manager_standin:UnchainedHash",
    "PREFIXCACHE_SCHEDULER": "block_manager_standin:Scheduler",
    "PREFIXCACHE_NUM_BLOCKS": "64",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def run(seed: int, budget: int) -> dict[str, Any]:
    """One suite run; its verdict, failures by check and wall time."""
    argv = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
        "-W", "ignore::pytest.PytestAssertRewriteWarning", "--prefixcache-verify",
        "--prefixcache-engine=reference_engine.harness:from_env",
        f"--prefixcache-examples={budget}", f"--prefixcache-seed={seed}",
        "--pyargs", "pytest_prefixcache.suite",
    ]  # fmt: skip
    env = {**os.environ, **ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT)])
    with tempfile.TemporaryDirectory(prefix="harness-budget-") as cwd:
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
    out = proc.stdout
    verdict = re.search(r"^verdict: (\S+)", out, re.M)
    by_check = re.search(r"^failures by check: (.*)$", out, re.M)
    failed = re.findall(r"^FAILED \S+::(\S+)", out, re.M)
    return {
        "seed": seed,
        "budget": budget,
        "caught": "equivalence" in (by_check.group(1) if by_check else ""),
        "verdict": verdict.group(1) if verdict else f"none (rc {proc.returncode})",
        "failures_by_check": by_check.group(1) if by_check else "",
        "failed_tests": failed,
        "wall_s": round(wall, 1),
        "rc": proc.returncode,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--budgets", type=int, nargs="+", default=[5, 10, 20, 40])
    ap.add_argument("--all", action="store_true", help="run every budget of every seed")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    rows = []
    for seed in args.seeds:
        for budget in args.budgets:
            row = run(seed, budget)
            rows.append(row)
            print(
                f"seed {seed} budget {budget}: {'caught' if row['caught'] else 'missed'} "
                f"({row['verdict']}; {row['failures_by_check'] or 'no failure'}; "
                f"{', '.join(row['failed_tests']) or '-'}) {row['wall_s']} s",
                flush=True,
            )
            if row["caught"] and not args.all:
                break
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
