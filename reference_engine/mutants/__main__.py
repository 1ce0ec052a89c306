"""``python -m reference_engine.mutants --table``: the bug zoo's detection table."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence

from . import MUTANTS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference_engine.mutants",
        description="List the bug-zoo mutants, or run the default verification against each.",
    )
    parser.add_argument("--table", action="store_true", help="Run the detection table")
    parser.add_argument("--examples", type=int, default=20, help="Examples per mutant (20)")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed (0)")
    parser.add_argument("--no-shrink", action="store_true", help="Stop at the first failure")
    parser.add_argument(
        "--save-corpus",
        metavar="DIR",
        nargs="?",
        const="fixtures/corpus/mutants",
        help="Save the shrunk streams into DIR (default: fixtures/corpus/mutants)",
    )
    parser.add_argument("names", nargs="*", help="Mutants to run (default: all)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in MUTANTS]
    if unknown:
        parser.error(f"unknown mutant(s) {', '.join(unknown)}; known: {', '.join(MUTANTS)}")
    if not args.table:
        for m in MUTANTS.values():
            flags = f" [{' '.join(m.flags)}]" if m.flags else ""
            print(f"{m.name:24} class {m.bug_class:<3} {m.expected_check:17} {m.breaks}{flags}")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    from .corpus import save_counterexample
    from .table import detection_table, format_table

    rows = detection_table(
        args.names or None, examples=args.examples, seed_value=args.seed, shrink=not args.no_shrink
    )
    print(f"examples per mutant: {args.examples}, seed: {args.seed}")
    print("\n".join(format_table(rows)))
    firsts = [r.seconds for r in rows if r.seconds is not None and r.expected is not None]
    if firsts:
        print(f"\nmedian seconds to first failure: {statistics.median(firsts):.1f}")
    if args.save_corpus:
        for r in rows:
            if r.detected and r.expected is not None and r.stream:
                print(save_counterexample(r, args.save_corpus))
    bad = [r.name for r in rows if r.expected is None and (r.detected or r.corpus)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
