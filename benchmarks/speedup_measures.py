"""Per-stream speedup of the unmodified reference engine's cache hits on the two measures
``--prefixcache-min-speedup`` can judge: whole calls (prefill and decode) and the time to
first token (``Outcome.first_token_seconds``: what reuse saves).

    python benchmarks/speedup_measures.py --seeds 0 1 2 --examples 10

Each seed runs the generated streams the mutants' detection table runs (``request_streams``
at the suite's closed-loop share, ``--examples`` examples, ``@seed(s)``, no shrinking, no
database) through the unmodified engine on the default fixture with no speedup floor, and
reads the per-request records: a stream is judged when its hits took at least
``SPEEDUP_MIN_SECONDS`` cold (as the check does). Prints, per measure, the judged streams, how
many fall below 1.0 and the lowest ratios, and the same for decode-heavy streams (hits whose
requests ask for at least 3 new tokens: the closed-loop ones).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

from pytest_prefixcache.checks import SPEEDUP_MIN_SECONDS
from pytest_prefixcache.strategies import CLOSED_LOOP_SHARE, request_streams
from pytest_prefixcache.types import Request
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions
from reference_engine import Engine, default_model_path
from reference_engine.model import load_model


def measure(seed_value: int, examples: int, engine: Engine) -> list[dict[str, Any]]:
    """One row per stream with cache hits: its two measures' warm and cold seconds."""
    with tempfile.TemporaryDirectory(prefix="speedup-") as tmp:
        verifier = Verifier(engine, options=VerifyOptions(failures_dir=Path(tmp), timeout=600))
        decode_heavy: dict[int, bool] = {}

        @seed(seed_value)
        @settings(
            max_examples=examples, deadline=None, database=None, phases=(Phase.generate,),
            suppress_health_check=list(HealthCheck), print_blob=False,
        )  # fmt: skip
        @given(stream=request_streams(closed_loop=CLOSED_LOOP_SHARE))
        def run(stream: tuple[Request, ...]) -> None:
            verifier.run(stream)
            decode_heavy[verifier.report.streams] = any(r.max_new_tokens >= 3 for r in stream)

        run()
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for r in verifier.report.records:
        if r.cached_tokens and r.warm_first_token is not None and r.cold_first_token is not None:
            s = sums[r.stream]
            s[0] += r.warm_seconds
            s[1] += r.cold_seconds
            s[2] += r.warm_first_token
            s[3] += r.cold_first_token
    return [
        {"seed": seed_value, "stream": k, "decode_heavy": decode_heavy.get(k, False),
         "warm": w, "cold": c, "first_warm": fw, "first_cold": fc}
        for k, (w, c, fw, fc) in sorted(sums.items())
    ]  # fmt: skip


def summary(rows: list[dict[str, Any]], label: str) -> list[str]:
    out = []
    for name, warm, cold in (("whole calls", "warm", "cold"),
                             ("time to first token", "first_warm", "first_cold")):  # fmt: skip
        judged = [r[cold] / r[warm] for r in rows if r[cold] >= SPEEDUP_MIN_SECONDS and r[warm]]
        low = sorted(judged)[:3]
        below = sum(x < 1.0 for x in judged)
        out.append(
            f"{label}, {name}: {len(judged)} streams judged, {below} below 1.0, lowest "
            + ", ".join(f"{x:.2f}x" for x in low)
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--examples", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    engine = Engine(load_model(default_model_path()))
    rows: list[dict[str, Any]] = []
    for s in args.seeds:
        engine.reset()
        got = measure(s, args.examples, engine)
        rows += got
        for line in summary(got, f"seed {s}"):
            print(line, flush=True)
    for line in summary(rows, "all"):
        print(line)
    for line in summary([r for r in rows if r["decode_heavy"]], "decode-heavy"):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
