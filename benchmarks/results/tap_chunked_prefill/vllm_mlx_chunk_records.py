"""vllm-mlx 0.6.0 --continuous-batching --chunked-prefill-tokens 32 (cache-less, as the cold
server: --disable-prefix-cache) under the logit tap on tiny-llama: prompts of 30, 34, 38, 57,
61 and 67 tokens sent one at a time (/v1/completions, 4 tokens, temperature 0); prints every
forward call's record (call, cache, input positions, per row: KV offset before/after, padding,
last input ids, greedy token) and the tracks TapLedger builds from them (one per request).

Run from the checkout with SEED_DIR naming the seed engines and a scratch directory (the
server's HOME and the records file; output as in vllm_mlx_chunk_records.txt):
    SEED_DIR=<main>/.engines/seed PYTHONPATH=. python \
        benchmarks/results/tap_chunked_prefill/vllm_mlx_chunk_records.py <scratch-dir>
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pytest_prefixcache.adapters.seed import commands, default_python
from pytest_prefixcache.tap import TapReader
from pytest_prefixcache.tap.tracks import TapLedger

ROOT = Path(__file__).resolve().parents[3]
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
COUNTS = [6, 7, 8, 11, 12, 13]  # words: 30, 34, 38, 57, 61, 67 prompt tokens


def main(scratch: Path) -> None:
    flags = ["--continuous-batching", "--chunked-prefill-tokens", "32"]
    _, cold = commands("vllm-mlx", flags, default_python("vllm-mlx"))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    argv = [w.replace("{port}", str(port)) for w in cold]
    tap = scratch / "tap.jsonl"
    tap.unlink(missing_ok=True)
    env = dict(os.environ, HOME=str(scratch), PREFIXCACHE_TAP=str(tap), HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(ROOT)
    with (scratch / "server.log").open("w") as log:
        p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                models = json.load(urllib.request.urlopen(base + "/v1/models", timeout=2))
                break
            except OSError:
                assert p.poll() is None, "the server died (see server.log)"
                time.sleep(1)
        model = models["data"][0]["id"]
        for n in COUNTS:
            text = " ".join(WORDS[i % len(WORDS)] + str(i) for i in range(n))
            body = {"model": model, "prompt": text, "max_tokens": 4, "temperature": 0}
            req = urllib.request.Request(
                base + "/v1/completions", json.dumps(body).encode(), JSON_HEADERS
            )
            reply = json.load(urllib.request.urlopen(req, timeout=120))
            print("prompt_tokens", reply["usage"]["prompt_tokens"], flush=True)
        for rec in TapReader(tap).read_new():
            rows = [
                (r.before, r.after, r.pad, None if r.ids is None else r.ids[-3:])
                for r in rec.row_list()
            ]
            tops = [int(r.logprobs.argmax()) for r in rec.row_list()]
            print(rec.seq, rec.cache, "n", rec.n_inputs, rows, "greedy", tops)
        led = TapLedger(TapReader(tap))
        led.refresh()
        print("tracks", len(led.tracks))
        for t in led.tracks:
            print(t.index, [(n, r.before, r.after) for n, r in t.rows], t.kinds)
    finally:
        p.terminate()
        p.wait(30)


JSON_HEADERS = {"content-type": "application/json"}

if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
