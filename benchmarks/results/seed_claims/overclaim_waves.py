"""rapid-mlx 0.16.10 under the tap, waves of up to 4 (the plugin's waves property, claims off so
that no over-claim stops it): every cached reply whose API ``cached_tokens`` differs from the
reuse the tap saw, with the wave it was in (each request's prompt digest, arrival, served
order) and the server's own ``[cache_fetch]`` / ``[schedule]`` log lines.

Run from the checkout, SEED_DIR naming the seed engines, TMPDIR a scratch directory:
    SEED_DIR=<main>/.engines/seed python benchmarks/results/seed_claims/overclaim_waves.py \
        OUT_DIR [EXAMPLES [FLAGS...]]
Default: 50 examples, ``--max-num-seqs 2 --shared-prefix-wait-tokens 1``. Writes
OUT_DIR/requests.jsonl (one line per cached reply), OUT_DIR/server.log (the cached server's log)
and prints a summary.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

from pytest_prefixcache.adapters.http import openai as openai_module
from pytest_prefixcache.adapters.http.server import ServerProcess
from pytest_prefixcache.adapters.seed import seed_server
from pytest_prefixcache.strategies import request_waves, wave_kwargs
from pytest_prefixcache.types import Outcome, Request, Wave
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions

FLAGS = ["--max-num-seqs", "2", "--shared-prefix-wait-tokens", "1"]
_local = threading.local()


def digest(request: Request) -> str:
    text = json.dumps([[m.role, [str(c) for c in m.content]] for m in request.messages])
    return hashlib.sha1(f"{request.namespace}|{text}".encode()).hexdigest()[:8]


def main() -> None:
    out_dir = Path(sys.argv[1])
    examples = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    flags = sys.argv[3:] or FLAGS
    out_dir.mkdir(parents=True, exist_ok=True)
    lines: list[dict[str, Any]] = []
    wave_no = [0]

    def log_tap(path: object, *, use_cache: bool, api: Outcome, tapped: Outcome, **_: Any) -> None:
        if use_cache:
            lines.append(
                {
                    "wave": wave_no[0],
                    "request": getattr(_local, "request", None),
                    "prompt_tokens": tapped.prompt_tokens,
                    "api_cached_tokens": api.cached_tokens,
                    "tap_reused_tokens": tapped.cached_tokens,
                    "served": tapped.served,
                    "time": time.time(),
                }
            )

    openai_module.log_tap = log_tap  # type: ignore[assignment]
    os.environ["SEED_TAP_LOGS"] = str(out_dir)  # turns log_tap (replaced above) on
    with seed_server("rapid-mlx", flags, concurrency=4, audit=False, claims=False) as engine:
        run = engine.run

        def traced(request: Request, use_cache: bool = True) -> Outcome:
            _local.request = digest(request)
            return run(request, use_cache=use_cache)

        engine.run = traced  # type: ignore[method-assign]
        verifier = Verifier(engine, options=VerifyOptions(failures_dir=out_dir / "failures"))
        waves_log = (out_dir / "waves.jsonl").open("w")

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            phases=(Phase.generate,),
            suppress_health_check=list(HealthCheck),
        )
        @seed(1)
        @given(waves=request_waves(max_size=4, **_kw(verifier)))
        def prop(waves: tuple[Wave, ...]) -> None:
            base = wave_no[0]
            try:
                verifier.run_waves(waves)
            finally:
                for k, w in enumerate(waves):
                    number = base + 1 + k
                    record = {
                        "wave": number,
                        "first_of_example": k == 0,
                        "requests": [digest(r) for r in w.requests],
                        "arrivals": list(w.arrivals),
                        "replies": [x for x in lines if x["wave"] == number],
                        "messages": [
                            [[m.role, [str(c)[:80] for c in m.content]] for m in r.messages]
                            for r in w.requests
                        ],
                    }
                    waves_log.write(json.dumps(record) + "\n")
                waves_log.flush()

        def step(*_: object) -> None:
            wave_no[0] += 1

        verifier.on_step = step

        try:
            prop()
        finally:
            server = engine.server
            if isinstance(server, ServerProcess) and server.log_path.exists():
                shutil.copy(server.log_path, out_dir / "server.log")
            (out_dir / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    over = [x for x in lines if (x["api_cached_tokens"] or 0) != x["tap_reused_tokens"]]
    extra = sum((x["api_cached_tokens"] or 0) - x["tap_reused_tokens"] for x in over)
    print(f"{len(lines)} cached replies, {len(over)} disagree with the tap, {extra} tokens in all")
    for x in over:
        print(json.dumps(x))


def _kw(verifier: Verifier) -> dict[str, Any]:
    return wave_kwargs(verifier.engine)


if __name__ == "__main__":
    main()
