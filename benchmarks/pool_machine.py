"""Run the block-pool state machine (tests/test_pool_state_machine.py) for a long budget.

    python benchmarks/pool_machine.py [--examples 300] [--steps 60]

Prints the number of steps whose invariants were checked and the wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import test_pool_state_machine as machine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=300, help="Examples (default 300)")
    ap.add_argument("--steps", type=int, default=60, help="Steps per example (default 60)")
    args = ap.parse_args()
    case = machine.PoolMachine.TestCase
    case.settings = settings(
        max_examples=args.examples,
        stateful_step_count=args.steps,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    t0 = time.perf_counter()
    case().runTest()
    elapsed = time.perf_counter() - t0
    print(
        f"checked steps: {machine.PoolMachine.checked_steps}  examples: {args.examples}  "
        f"wall: {elapsed:.1f} s  invariants held"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
