"""How many fresh instances the baseline audit builds when one may answer N audited requests
that share nothing (``fresh_instance_share``), against one per audited request, on the default
run's streams (the reference engine, ``--prefixcache-seed``).

    python benchmarks/audit_share.py --shares 1 8 --seed 1 --examples 100

For servers that take 15-40 s to start (the seed engines, vLLM CPU), each fresh instance is a
server start: the ratio of instances is the ratio of the audit's start-up time. Prints one line
per share: requests, audited, fresh instances, wall time."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: A module the run names as its engine: the default engine with the share from the
#: environment, counting every build (the first is the engine under test).
FACTORY = """
import os
import reference_engine

def build():
    with open(os.environ["AUDIT_SHARE_COUNT"], "a") as f:
        f.write("1")
    engine = reference_engine.default_engine()
    engine.fresh_instance_share = int(os.environ["AUDIT_SHARE"])
    return engine
"""


def run(share: int, seed: int, examples: int) -> dict[str, Any]:
    """One verification in a process of its own (each gets the plugin's session anew)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "share_factory.py").write_text(FACTORY)
        count, report = Path(tmp) / "count", Path(tmp) / "report.json"
        env = dict(os.environ, AUDIT_SHARE=str(share), AUDIT_SHARE_COUNT=str(count))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tmp, env.get("PYTHONPATH")]))
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
        args += ["--rootdir", tmp]
        args += ["--pyargs", "pytest_prefixcache.suite", "--prefixcache-verify"]
        args += ["--prefixcache-engine=share_factory:build", f"--prefixcache-seed={seed}"]
        args += [f"--prefixcache-examples={examples}", f"--prefixcache-report={report}"]
        args += ["--prefixcache-database=none", f"--prefixcache-failures-dir={tmp}/failures"]
        start = time.perf_counter()
        rc = subprocess.run(args, env=env, cwd=tmp, stdout=subprocess.DEVNULL).returncode
        wall = time.perf_counter() - start
        data = json.loads(report.read_text())
        built = len(count.read_text()) - 1
    applied = data.get("coverage", {}).get("cold baseline", {}).get("applied", 0)
    return {"share": share, "exit": int(rc), "requests": data.get("requests"),
            "audited": applied, "fresh_instances": built, "wall_s": round(wall, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shares", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--json", type=Path, help="Write the figures to this JSON file")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = [run(s, args.seed, args.examples) for s in args.shares]
    for r in rows:
        print(json.dumps(r))
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
