"""Stub HTTP servers that answer like vLLM and like llama-server, so CI needs neither engine.

A deterministic toy model behind a real block prefix cache: prompt token ids are the UTF-8
bytes of the messages' JSON with role markers, an image becomes ``<vision_start>`` + 4
``<image_pad>`` + ``<vision_end>`` (the pads carry the image's bytes into the cache key, as
vLLM's multimodal hashes do), and each decode step's top_logprobs are a function of the whole
context (prompt, images, generated tokens). A correct stub's cached and uncached answers are
identical; ``cached_tokens`` is the longest cached 32-token-block prefix.

Flavours (their field shapes, from ../shared/NOTES.md):

- ``vllm``: top_logprobs entries ``{token, logprob, bytes}`` without ``id``; non-printable
  tokens named ``''``; ``token_id:N`` with ``return_tokens_as_token_ids``; ``prompt_token_ids``
  and the choice's ``token_ids`` with ``return_token_ids``; tenants by the ``cache_salt`` body
  field; ``prompt_logprobs: K`` (the top K and the prompt's own token at every prompt position,
  read through the cache on a hit: unlike vLLM 0.32, which reads no cache for such a request);
  ``POST /reset_prefix_cache`` answers ``{"success": bool}``, ``/reset_mm_cache`` and
  ``/reset_encoder_cache`` an empty 200; ``GET /metrics``: vLLM 0.32's prefix-cache counters
  (``vllm:prefix_cache_hits_total``, ``vllm:prompt_tokens_cached_total``,
  ``vllm:prompt_tokens_by_source_total``) in Prometheus text.
- ``llama``: entries with ``id``; ``timings.cache_n``/``prompt_n``; ``tokens_cached`` is the
  whole prompt (not reuse); ``/apply-template`` and ``/tokenize``; ``cache_prompt: false``
  and ``--no-cache-prompt`` turn reuse off; no reset endpoint (404); ``GET /metrics``, the
  counter ``llamacpp:prompt_tokens_cached_total`` (the cached tokens of every reply).

Faults (negative controls): ``shifted`` (step i carries step i+1's top_logprobs), ``short``
(the last logprobs entry is missing), ``reset_false`` (the prefix reset says success false and
keeps the cache), ``ignores_salt`` (the cache key leaves the salt out), ``null_logprobs``,
``corrupt`` / ``corrupt_step2`` (a cache hit moves the logprobs of decode step 0 / 2 by 1e-3,
greedy tokens unchanged), ``metric_overclaim`` (vllm: the counters add a block of 32 tokens
more than the reply's ``cached_tokens`` on every hit), ``cache_n_overclaims`` (llama:
``timings.cache_n`` says 4 more than ``cached_tokens`` and the counter on a hit),
``corrupt_prompt`` (a cache hit's prompt_logprobs at its reused positions move by 1e-3),
``sampled_second`` (each step's own entry names its second-best token, as a
grammar-constrained sampler's does; the logprobs stay the raw ones), ``stale_after_evict`` (vllm,
with a capacity: an evicted block's hash stays indexed, so a later hit reads the tokens of the
block that overwrote it: a wrong answer after eviction).

Capacity (vllm): ``--num-gpu-blocks-override N`` keeps at most N - 1 blocks (vLLM holds one
back as its null block), the salted cold runs' blocks included, and evicts the least recently
used first; a request's blocks are released last block first, as vLLM's free queue gets them,
so its first block is evicted last. ``vllm:kv_block_idle_before_evict_seconds_count`` counts
the evictions (vLLM's residency metric with ``--kv-cache-metrics-sample 1``).

Run as a script: ``python stub_openai.py --flavour vllm [--fault F] [--no-cache-prompt] --port P``
(``$STUB_FAULT`` is the default fault; unknown arguments, vLLM's and llama-server's, are ignored;
``$STUB_ARGV_LOG``: append the arguments it was started with, a JSON list per line;
``$STUB_WARM``: a chat request body the stub serves through its own cache before it answers
``/health``, as rapid-mlx 0.16.10 warms up hybrid models).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import threading
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BLOCK = 32
K = 20
ROLE = {"system": 256, "user": 257, "assistant": 258}
END, GEN, VSTART, PAD, VEND = 259, 260, 261, 262, 263
VOCAB = 264
PADS = 4


def _parts(message: dict[str, Any]) -> list[tuple[str, str]]:
    content = message["content"]
    if isinstance(content, str):
        return [("text", content)]
    out = []
    for p in content:
        if p["type"] == "text":
            out.append(("text", p["text"]))
        else:
            out.append(("image", p["image_url"]["url"]))
    return out


def template(messages: list[dict[str, Any]]) -> str:
    """The stub's chat template for text requests (what ``/apply-template`` answers)."""
    return (
        "".join(f"<{m['role']}>" + "".join(t for _, t in _parts(m)) + "</>" for m in messages)
        + "<gen>"
    )


def render(messages: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(token id, extra key) per prompt token; image pads carry the image's digest."""
    if all(kind == "text" for m in messages for kind, _ in _parts(m)):
        return [(b, "") for b in template(messages).encode()]
    out: list[tuple[int, str]] = []
    for m in messages:
        out.append((ROLE[m["role"]], ""))
        for kind, value in _parts(m):
            if kind == "text":
                out += [(b, "") for b in value.encode()]
            else:
                digest = hashlib.sha256(value.encode()).hexdigest()[:16]
                out += [(VSTART, ""), *[(PAD, digest)] * PADS, (VEND, "")]
        out.append((END, ""))
    return [*out, (GEN, "")]


def tokenize_text(text: str) -> list[int]:
    return list(text.encode())


def step_top(context: list[tuple[int, str]]) -> list[tuple[int, float]]:
    seed = hashlib.sha256(json.dumps(context).encode()).digest()
    rng = random.Random(seed)
    ids = rng.sample(range(32, 127), K)
    return [(t, -0.05 - 0.37 * i - rng.random() / 100) for i, t in enumerate(ids)]


class Stub:
    """The toy model and its prefix cache."""

    def __init__(
        self, flavour: str, fault: str = "", cache: bool = True, capacity: int | None = None
    ) -> None:
        self.flavour, self.fault, self.cache = flavour, fault, cache
        self.capacity = capacity  # blocks kept at most (None: every block)
        self.index: dict[str, int] = {}  # block hash -> slot
        self.lru: OrderedDict[str, int] = OrderedDict()  # the blocks held, oldest first
        self.slots: list[list[tuple[int, str]]] = []  # what each slot holds
        self.evictions = 0
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.counters = {"hits": 0, "computed": 0}
        self.cached_total = 0  # llama's prompt_tokens_cached_total

    def _key(self, salt: str, ext: list[tuple[int, str]]) -> str:
        salt = "" if self.fault == "ignores_salt" else salt
        return hashlib.sha256(json.dumps([salt, ext]).encode()).hexdigest()

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(body)
        ext = render(body["messages"])
        salt = str(body.get("cache_salt", ""))
        use = self.cache and body.get("cache_prompt", True) is not False
        cached, context = 0, list(ext)
        with self.lock:
            if use:
                cached, context = self._hit(salt, ext)
                self._store(salt, ext)
            claimed = cached + (BLOCK if cached and self.fault == "metric_overclaim" else 0)
            self.counters["hits"] += claimed
            self.counters["computed"] += len(ext) - cached
        n = int(body.get("max_tokens") or 16)
        tops, tokens = [], []
        for _ in range(n + 1):
            top = step_top(context)
            tops.append(top)
            tokens.append(top[0][0])
            context.append((top[0][0], ""))
        tokens = tokens[:n]
        k = int(body.get("prompt_logprobs") or 0) if self.flavour == "vllm" else 0
        prompt = self._prompt_logprobs(context[: len(ext)], ext, k, cached) if k else None
        if cached and self.fault in ("corrupt", "corrupt_step2"):
            i = 0 if self.fault == "corrupt" else min(2, n - 1)
            tops[i] = [(t, lp + 1e-3) for t, lp in tops[i]]
        if self.fault == "shifted":
            tops = tops[1:]
        tops = tops[:n]
        if self.fault == "short":
            tops = tops[:-1]
        reply = self._reply(body, ext, cached, tokens, tops)
        if prompt is not None:
            reply["prompt_logprobs"] = prompt
        return reply

    def _prompt_logprobs(
        self, context: list[tuple[int, str]], ext: list[tuple[int, str]], k: int, cached: int
    ) -> list[dict[str, dict[str, Any]] | None]:
        """vLLM's prompt_logprobs: per position, the prompt's own token and the top k of the
        distribution the context before it gives (``corrupt_prompt``: a hit's reused
        positions move by 1e-3, as a store of prompt logprobs keyed without the prefix)."""
        out: list[dict[str, dict[str, Any]] | None] = [None]
        for pos in range(1, len(ext)):
            top = step_top(context[:pos])[:k]
            own = ext[pos][0]
            values = dict(top)
            values.setdefault(own, -4.0 - own / 1000)
            if self.fault == "corrupt_prompt" and pos < cached:
                values = {t: lp + 1e-3 for t, lp in values.items()}
            ranked = sorted(values, key=lambda t: -values[t])
            out.append(
                {
                    str(t): {"logprob": values[t], "rank": ranked.index(t) + 1, "decoded_token": ""}
                    for t in values
                }
            )
        return out

    def _hit(self, salt: str, ext: list[tuple[int, str]]) -> tuple[int, list[tuple[int, str]]]:
        """The cached prefix's length (whole blocks, never the whole prompt) and the context
        the model then reads: the slots' tokens for that prefix, the prompt's after it."""
        cached, context = 0, []
        for end in range(BLOCK, len(ext), BLOCK):
            slot = self.index.get(self._key(salt, ext[:end]))
            if slot is None:
                break
            cached, context = end, context + self.slots[slot]
        return cached, context + ext[cached:]

    def _store(self, salt: str, ext: list[tuple[int, str]]) -> None:
        """Keep every full block of the prompt: the ones hit are held first (in use: never
        evicted for this request's own new blocks), then released last block first."""
        keys = [self._key(salt, ext[:end]) for end in range(BLOCK, len(ext) + 1, BLOCK)]
        for key in keys:
            if key in self.lru:
                self.lru.move_to_end(key)
        for i in reversed(range(len(keys))):
            if keys[i] not in self.lru:
                slot = self._free_slot()
                self.slots[slot] = ext[i * BLOCK : (i + 1) * BLOCK]
                self.index[keys[i]] = self.lru[keys[i]] = slot
        for key in reversed(keys):
            self.lru.move_to_end(key)

    def _free_slot(self) -> int:
        if self.capacity is None or len(self.slots) < self.capacity or not self.lru:
            self.slots.append([])
            return len(self.slots) - 1
        key, slot = self.lru.popitem(last=False)
        self.evictions += 1
        if self.fault != "stale_after_evict":  # the fault keeps the evicted hash indexed
            del self.index[key]
        return slot

    def reset(self) -> None:
        self.index.clear()
        self.lru.clear()
        self.slots.clear()

    def _entry(self, body: dict[str, Any], t: int, lp: float) -> dict[str, Any]:
        if self.flavour == "llama":
            return {"id": t, "token": chr(t), "logprob": lp, "bytes": list(chr(t).encode())}
        if body.get("return_tokens_as_token_ids"):
            name = f"token_id:{t}"
        else:
            name = chr(t) if 48 <= t < 123 and chr(t).isalnum() else ""
        return {"token": name, "logprob": lp, "bytes": list(name.encode())}

    def _reply(
        self,
        body: dict[str, Any],
        ext: list[tuple[int, str]],
        cached: int,
        tokens: list[int],
        tops: list[list[tuple[int, float]]],
    ) -> dict[str, Any]:
        content = []
        for i, top in enumerate(tops):
            sampled = top[1][0] if self.fault == "sampled_second" else tokens[i]
            own = dict(top).get(sampled, top[0][1])
            entry = self._entry(body, sampled, own)
            entry["top_logprobs"] = [self._entry(body, t, lp) for t, lp in top]
            content.append(entry)
        logprobs = None if self.fault == "null_logprobs" else {"content": content}
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(chr(t) for t in tokens)},
            "logprobs": logprobs,
            "finish_reason": "length",
        }
        usage = {
            "prompt_tokens": len(ext),
            "completion_tokens": len(tokens),
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        reply: dict[str, Any] = {"object": "chat.completion", "choices": [choice], "usage": usage}
        if self.flavour == "vllm" and body.get("return_token_ids"):
            reply["prompt_token_ids"] = [t for t, _ in ext]
            choice["token_ids"] = tokens
        if self.flavour == "llama":
            with self.lock:
                self.cached_total += cached
            over = 4 if cached and self.fault == "cache_n_overclaims" else 0
            reply["timings"] = {"cache_n": cached + over, "prompt_n": len(ext) - cached}
            reply["tokens_cached"] = len(ext)  # the whole prompt, not reuse
        return reply

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/v1/chat/completions":
            return 200, self.complete(body)
        if self.flavour == "vllm" and path == "/reset_prefix_cache":
            if self.fault == "reset_false":
                return 200, {"success": False}
            self.reset()
            return 200, {"success": True}
        if self.flavour == "vllm" and path in ("/reset_mm_cache", "/reset_encoder_cache"):
            return 200, None
        if self.flavour == "llama" and path == "/apply-template":
            return 200, {"prompt": template(body["messages"])}
        if self.flavour == "llama" and path == "/tokenize":
            return 200, {"tokens": tokenize_text(body["content"])}
        return 404, {"error": {"code": 404, "message": "File Not Found"}}

    def metrics(self) -> str:
        """vLLM's prefix-cache counters, Prometheus text (a HELP line, then samples)."""
        labels = 'engine="0",model_name="stub"'
        hits, computed = self.counters["hits"], self.counters["computed"]
        return "\n".join(
            [
                "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.",
                f"vllm:prefix_cache_hits_total{{{labels}}} {float(hits)}",
                f"vllm:prefix_cache_hits_created{{{labels}}} 1.7e9",
                f"vllm:prompt_tokens_cached_total{{{labels}}} {float(hits)}",
                f'vllm:prompt_tokens_by_source_total{{{labels},source="local_compute"}} '
                f"{float(computed)}",
                f'vllm:prompt_tokens_by_source_total{{{labels},source="local_cache_hit"}} '
                f"{float(hits)}",
                f"vllm:kv_block_idle_before_evict_seconds_count{{{labels}}} "
                f"{float(self.evictions)}",
                "",
            ]
        )


class Handler(BaseHTTPRequestHandler):
    server: Any

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, payload: Any) -> None:
        raw = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        stub = self.server.stub
        if self.path == "/metrics" and stub.flavour in ("vllm", "llama"):
            raw = (
                stub.metrics()
                if stub.flavour == "vllm"
                else (
                    "# TYPE llamacpp:prompt_tokens_cached_total counter\n"
                    f"llamacpp:prompt_tokens_cached_total {stub.cached_total}\n"
                )
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return
        self._send(200, {"status": "ok"} if self.path == "/health" else None)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(*self.server.stub.post(self.path, json.loads(raw or b"{}")))


def serve(
    flavour: str, fault: str = "", cache: bool = True, port: int = 0, capacity: int | None = None
) -> ThreadingHTTPServer:
    """A stub listening on 127.0.0.1 (``port`` 0: ephemeral), served by a daemon thread;
    ``shutdown()`` and ``server_close()`` it when done."""
    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    srv.stub = Stub(flavour, fault, cache, capacity)  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def url_of(srv: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


if __name__ == "__main__":  # vLLM's and llama-server's other arguments are ignored
    ap = argparse.ArgumentParser()
    ap.add_argument("--flavour", choices=("vllm", "llama"), required=True)
    ap.add_argument("--fault", default=os.environ.get("STUB_FAULT", ""))
    ap.add_argument("--no-cache-prompt", action="store_true")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--num-gpu-blocks-override", type=int, default=None)
    a, _ = ap.parse_known_args()
    if os.environ.get("STUB_ARGV_LOG"):  # which command line started it (the matrix tests)
        with open(os.environ["STUB_ARGV_LOG"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps(sys.argv[1:]) + "\n")
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    blocks = a.num_gpu_blocks_override
    srv.stub = Stub(  # type: ignore[attr-defined]
        a.flavour, a.fault, not a.no_cache_prompt, None if blocks is None else blocks - 1
    )
    if os.environ.get("STUB_WARM"):
        srv.stub.complete(json.loads(os.environ["STUB_WARM"]))  # type: ignore[attr-defined]
    srv.serve_forever()
