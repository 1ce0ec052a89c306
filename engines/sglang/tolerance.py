"""Measure SGLang's cached-vs-cold logprob differences and the smallest one-token cache bug.

Usage (this project's Python; SGLang from engines/sglang/install.sh, models from
engines/sglang/build_models.py, see engines/sglang/sglang_lab.py for the variables)::

    nice -n 10 python engines/sglang/tolerance.py [--requests 40] [--steps 4] \
        [--flags "--page-size 16"] [--json OUT.json]

One SGLang server (the preset's command, radix cache on). For each of ``--requests`` random
prompts of token ids (``/generate`` with ``input_ids``, greedy, the whole vocabulary's
logprobs at every decode step):

- **cached**: flush, prefill a random prefix of the prompt, then the whole prompt: SGLang
  reports ``cached_tokens`` > 0 and reuses the prefix's KV;
- **cold**: flush, the whole prompt alone (``cached_tokens`` must be 0);
- **one-token bug**: flush, the prompt with one token of the reused prefix replaced (what a
  cache that reused one stale token would compute).

It prints the worst and median |cached - cold| over every step's logprobs (greedy tokens must
agree) and the smallest |bug - cold| at step 0, and writes them as JSON. The rule in
pytest_prefixcache/adapters/tolerances.py (``ENGINE_ATOL["sglang", "*"]``) is the worst
difference times ~10, and must stay far below the smallest bug.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sglang_lab

from pytest_prefixcache.adapters.http.server import ServerProcess, http_json
from pytest_prefixcache.adapters.sglang import SGLANG_ENV, sglang_command

VOCAB = 480  # the fixtures' ordinary tokens (added tokens above)


def generate(base: str, ids: list[int], steps: int, k: int) -> tuple[list[dict[int, float]], int]:
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": steps, "temperature": 0.0},
        "return_logprob": True,
        "top_logprobs_num": k,
    }
    status, reply = http_json("POST", base + "/generate", body, timeout=600)
    if status != 200:
        raise SystemExit(f"/generate answered {status}: {str(reply)[:300]}")
    meta = reply["meta_info"]
    tops = [{int(t): float(lp) for lp, t, *_ in step} for step in meta["output_top_logprobs"]]
    return tops, int(meta.get("cached_tokens") or 0)


def flush(base: str) -> None:
    status, reply = http_json("POST", base + "/flush_cache", {}, timeout=60)
    if status != 200:
        raise SystemExit(f"/flush_cache answered {status}: {reply}")


def worst(a: list[dict[int, float]], b: list[dict[int, float]], steps: int = 99) -> float:
    out = 0.0
    for x, y in list(zip(a, b))[:steps]:
        for t in x.keys() & y.keys():
            out = max(out, abs(x[t] - y[t]))
    return out


def greedy(tops: list[dict[int, float]]) -> list[int]:
    return [max(t, key=t.__getitem__) for t in tops]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--top", type=int, default=VOCAB, help="logprobs per step (default: all)")
    ap.add_argument("--flags", default="", help="extra SGLang flags, one string")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args(argv)
    flags = shlex.split(a.flags)
    cmd = sglang_command(sglang_lab.model_dir("text"), flags, python=sglang_lab.python())
    server = ServerProcess(cmd, env=SGLANG_ENV, start_timeout=900)
    t0 = time.monotonic()
    server.start()
    print(f"server up in {time.monotonic() - t0:.0f} s: {shlex.join(cmd)}", flush=True)
    rng = random.Random(a.seed)
    diffs, bugs, reused = [], [], []
    try:
        for i in range(a.requests):
            n = rng.randint(24, 320)
            ids = [rng.randrange(VOCAB) for _ in range(n)]
            cut = rng.randint(8, n - 4)
            flush(server.url)
            generate(server.url, ids[:cut], 1, 1)
            cached, hit = generate(server.url, ids, a.steps, a.top)
            flush(server.url)
            cold, miss = generate(server.url, ids, a.steps, a.top)
            if hit <= 0 or miss != 0:
                raise SystemExit(f"request {i}: cached_tokens {hit} (cached), {miss} (cold)")
            if greedy(cached) != greedy(cold):
                raise SystemExit(
                    f"request {i}: greedy tokens differ {greedy(cached)} {greedy(cold)}"
                )
            p = rng.randrange(hit)
            stale = list(ids)
            stale[p] = (ids[p] + 1 + rng.randrange(VOCAB - 1)) % VOCAB
            flush(server.url)
            bug, _ = generate(server.url, stale, 1, a.top)
            d, b = worst(cached, cold), worst(bug, cold, steps=1)
            diffs.append(d)
            bugs.append(b)
            reused.append(hit)
            print(f"{i:3d}: {n:3d} tokens, reused {hit:3d}: cached-cold {d:.3g}, "
                  f"one-token bug at {p}: {b:.3g}", flush=True)  # fmt: skip
    finally:
        server.stop()
    figures: dict[str, Any] = {
        "flags": flags,
        "requests": a.requests,
        "steps": a.steps,
        "logprobs_per_step": a.top,
        "cached_vs_cold_worst": max(diffs),
        "cached_vs_cold_median": statistics.median(diffs),
        "cached_vs_cold_exact": sum(d == 0 for d in diffs),
        "one_token_bug_smallest": min(bugs),
        "one_token_bug_median": statistics.median(bugs),
        "reused_tokens_median": statistics.median(reused),
        "command": "python engines/sglang/tolerance.py " + shlex.join(argv),
    }
    print(json.dumps(figures, indent=2))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
