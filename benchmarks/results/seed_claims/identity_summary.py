"""One line per combination of a seed-engine run's suite.json (engines/seed/run.sh verify):
its verdict, the wave requests and how the tap attributed them (the coverage row `tap
attribution by id`), the wave decode steps compared, and the checks that failed.

    python benchmarks/results/seed_claims/identity_summary.py REPORTS/run-NAME/suite.json...
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    for path in sys.argv[1:]:
        report = json.load(open(path))
        print(f"# {path} (seed {report.get('seed')})")
        for c in report.get("configs") or [report]:
            cov = c.get("coverage") or {}
            by = cov.get("tap attribution by id", {})
            steps = cov.get("wave decode steps", {})
            failed = c.get("failures_by_check") or {}
            print(
                f"{c.get('name')}: {c.get('verdict')}; attribution {by}; decode steps {steps};"
                f" failed {failed}; engine error {str(c.get('engine_error') or '')[:200]}"
            )


if __name__ == "__main__":
    main()
