"""A tapped chat server with a real prefix cache and a toy model, for the claims check's controls.

The model maps a token sequence to a deterministic log-softmax over 64 tokens (seeded by a hash
of the whole sequence), so a cached and an uncached run compute the same thing. The cache keeps
every sequence it computed and reuses the longest common prefix (at least one prompt token is
always computed); ``--no-cache`` reuses nothing. Every forward call is written to
``$PREFIXCACHE_TAP`` as the logit tap writes it (prefill, then one record per decode step, one
step ahead as mlx-lm computes). Reuse is reported in ``usage``, ``GET /v1/cache/stats``
(``tokens_saved``, ``hits``), ``/metrics`` (``stub_prefix_cache_tokens_total``), the log
(``prefix cache hit: N tokens``) and the ``x-cache-hit`` header.

``--fault`` breaks one claim (each is a negative control of tests/test_claims.py):
``stats-overclaim`` (stats add 4 tokens to every hit), ``log-false-hit`` (the log reports a hit
on every request), ``shift-logprobs`` (``logprobs.content[i]`` holds step i+1's distribution),
``drop-last`` (the last ``logprobs.content`` entry is omitted). Three break the request count
(tests/test_tap_tracks.py): ``refuse-first`` answers the first chat request 503 without running
the model (oMLX's memory gate), ``replay-repeat`` answers an exact repeat from the logits it
stored, without a forward call (a request that runs no prefill), ``double-prefill`` prefills
every prompt a second time, whole, after answering it (an entry stored by computing it
again). ``no-last-kv`` decodes without feeding its last generated token back (no step ahead:
the reference engine's decode) and keeps the KV it computed, all but that token (the
decode-KV probe's control, tests/test_decode_kv.py).
Run as ``python tests/claims_stub_server.py --port P [--no-cache] [--fault F]``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

VOCAB = 64
TOP = 5


def tokens_of(messages: list[dict[str, Any]]) -> list[int]:
    text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
    return [b % VOCAB for b in text.encode()]


def logprobs_after(seq: list[int]) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(bytes(seq)).digest()[:8], "little")
    logits = (np.random.default_rng(seed).standard_normal(VOCAB) * 3).astype(np.float32)
    return (logits - np.log(np.sum(np.exp(logits.astype(np.float64))))).astype(np.float32)


class Stub:
    def __init__(self, cache: bool, fault: str) -> None:
        self.cache, self.fault = cache, fault
        self.seen: list[list[int]] = []
        self.stats = {"hits": 0, "misses": 0, "tokens_saved": 0}
        self.lock = threading.Lock()
        self.seq = 0
        self.posts = 0
        self.replies: dict[str, tuple[dict[str, Any], dict[str, str]]] = {}

    def tap(self, n: int, offset: int, lp: np.ndarray) -> None:
        path = os.environ.get("PREFIXCACHE_TAP")
        if not path:
            return
        rec = {"seq": self.seq, "cls": "stub.Model", "n": n, "batch": 1, "offset": offset}
        rec["lp"] = base64.b64encode(lp.tobytes()).decode("ascii")
        self.seq += 1
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def complete(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        prompt = tokens_of(body["messages"])
        reused = 0
        if self.cache:
            for old in self.seen:
                k = 0
                while k < min(len(old), len(prompt) - 1) and old[k] == prompt[k]:
                    k += 1
                reused = max(reused, k)
        n = max(1, int(body.get("max_tokens") or 1))
        seq, dists = list(prompt), []
        ahead = 0 if self.fault == "no-last-kv" else 1
        for step in range(n + ahead):  # one step ahead, as mlx-lm computes
            lp = logprobs_after(seq)
            self.tap(len(prompt) - reused if step == 0 else 1, len(seq), lp)
            dists.append(lp)
            seq.append(int(np.argmax(lp)))
        generated = seq[len(prompt) : len(prompt) + n]
        if self.cache:
            self.seen.append(prompt + generated[: len(generated) - 1 + ahead])
        if self.fault == "double-prefill":
            self.tap(len(prompt), len(prompt), logprobs_after(prompt))
        shown = dists[1 : n + 1] if self.fault == "shift-logprobs" else dists[:n]
        content = [self.step(tok, lp) for tok, lp in zip(generated, shown, strict=True)]
        if self.fault == "drop-last":
            content = content[:-1]
        hit = reused > 0
        self.stats["hits" if hit else "misses"] += 1
        self.stats["tokens_saved"] += reused + (4 if hit and self.fault == "stats-overclaim" else 0)
        if hit or self.fault == "log-false-hit":
            print(f"prefix cache hit: {reused if hit else len(prompt) - 1} tokens", flush=True)
        else:
            print(f"prefix cache miss: {len(prompt)} tokens computed", flush=True)
        reply = {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": "".join(chr(65 + t % 26) for t in generated),
                    },
                    "finish_reason": "length",
                    "logprobs": {"content": content},
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": n,
                "prompt_tokens_details": {"cached_tokens": reused},
            },
        }
        return reply, {"x-cache-hit": "hit" if hit else "miss"}

    @staticmethod
    def step(token: int, lp: np.ndarray) -> dict[str, Any]:
        top = [
            {"id": int(i), "token": f"t{int(i)}", "logprob": float(lp[i])}
            for i in np.argsort(-lp)[:TOP]
        ]
        return {"id": token, "token": f"t{token}", "logprob": float(lp[token]), "top_logprobs": top}


def handler(stub: Stub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            with stub.lock:
                if self.path == "/health":
                    self.send(200, {"status": "ok"})
                elif self.path == "/v1/cache/stats":
                    self.send(200, dict(stub.stats))
                elif self.path == "/metrics":
                    total = stub.stats["tokens_saved"]
                    text = "# TYPE stub_prefix_cache_tokens_total counter\n"
                    text += f'stub_prefix_cache_tokens_total{{model="stub"}} {float(total)}\n'
                    self.send(200, text)
                else:
                    self.send(404, {"error": self.path})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            with stub.lock:
                if self.path == "/v1/chat/completions":
                    stub.posts += 1
                    key = json.dumps(body, sort_keys=True)
                    if stub.fault == "refuse-first" and stub.posts == 1:
                        self.send(503, {"error": {"message": "memory at capacity"}})
                    elif stub.fault == "replay-repeat" and key in stub.replies:
                        self.send(200, *stub.replies[key])  # no forward call, no tap record
                    else:
                        stub.replies[key] = stub.complete(body)
                        self.send(200, *stub.replies[key])
                elif self.path == "/v1/cache/reset":
                    stub.seen.clear()
                    self.send(200, {"ok": True})
                else:
                    self.send(404, {"error": self.path})

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--fault", default="")
    args = parser.parse_args()
    stub = Stub(not args.no_cache, args.fault)
    ThreadingHTTPServer(("127.0.0.1", args.port), handler(stub)).serve_forever()


if __name__ == "__main__":
    main()
