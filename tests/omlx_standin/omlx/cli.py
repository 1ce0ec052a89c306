"""``omlx serve`` as oMLX 0.7.0 (flyto-mlx) answers, with a toy model and a real block cache.

What it shares with oMLX (read in flyto-mlx 0.7.0): ``serve --model-dir DIR`` serves every
model folder of DIR under the folder's name (the request's ``model``); prompts are the model's
chat template rendered by its tokenizer; the prefix cache keeps whole blocks of
``SchedulerConfig().paged_cache_block_size`` tokens (reuse stops at the last whole block that
leaves one prompt token to compute) and ``--no-cache`` turns it off; settings are read from
``~/.fmlx/settings.json``; ``logprobs`` are ignored; reuse is reported in
``usage.prompt_tokens_details.cached_tokens``, summed in ``GET /api/status``
``total_cached_tokens``, and logged at debug level as ``paged cache hit, N tokens in B blocks``.
Every forward call is written to ``$PREFIXCACHE_TAP`` as the logit tap writes it (the prompt
but its last token, then one record per decode step, as mlx-lm's BatchGenerator computes).
The model maps a token sequence to a deterministic log-softmax (seeded by a hash of the whole
sequence), so cached and uncached runs compute the same thing.

``$OMLX_STANDIN_FAULT`` breaks one claim (negative controls of tests/test_omlx_stub.py):
``api-overclaim`` (the API reports one more block than was reused), ``stats-overclaim``
(``total_cached_tokens`` grows by one block more), ``log-false-hit`` (a hit line on every
request).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from .scheduler import SchedulerConfig

VOCAB = 64
log = logging.getLogger("omlx.scheduler")


class Model:
    """The class a tap target names (never called: the stand-in writes its records itself)."""


def logprobs_after(seq: list[int]) -> np.ndarray:
    seed = int.from_bytes(
        hashlib.sha256(np.asarray(seq, np.int64).tobytes()).digest()[:8], "little"
    )
    logits = (np.random.default_rng(seed).standard_normal(VOCAB) * 3).astype(np.float64)
    return (logits - np.log(np.sum(np.exp(logits)))).astype(np.float32)


class Standin:
    def __init__(self, model_dir: Path, cache: bool, block: int, fault: str) -> None:
        self.model_dir, self.cache, self.block, self.fault = model_dir, cache, block, fault
        self.blocks: set[tuple[int, ...]] = set()
        self.total_cached = 0
        self.lock = threading.Lock()
        self.seq = 0
        self.tokenizers: dict[str, Any] = {}

    def tokens(self, model: str, messages: list[dict[str, Any]]) -> list[int]:
        if model not in self.tokenizers:
            from transformers import AutoTokenizer

            self.tokenizers[model] = AutoTokenizer.from_pretrained(str(self.model_dir / model))
        out = self.tokenizers[model].apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    def tap(self, n: int, offset: int, lp: np.ndarray) -> None:
        path = os.environ.get("PREFIXCACHE_TAP")
        if not path:
            return
        rec = {"seq": self.seq, "cls": "omlx.cli.Model", "n": n, "batch": 1, "offset": offset}
        rec["lp"] = base64.b64encode(lp.tobytes()).decode("ascii")
        self.seq += 1
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def lookup(self, prompt: list[int]) -> int:
        if not self.cache:
            return 0
        reused = 0
        for end in range(self.block, len(prompt), self.block):  # leaves >= 1 token to compute
            if tuple(prompt[:end]) not in self.blocks:
                break
            reused = end
        return reused

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = self.tokens(body["model"], body["messages"])
        reused = self.lookup(prompt)
        if reused or self.fault == "log-false-hit":
            shown = reused or self.block
            log.debug(
                "Request x: paged cache hit, %d tokens in %d blocks, %d tokens remaining, "
                "cache reconstructed", shown, shown // self.block, len(prompt) - shown,
            )  # fmt: skip
        n = max(1, int(body.get("max_tokens") or 1))
        seq = list(prompt[:reused])
        if len(prompt) - 1 > reused:  # the prompt but its last token, then one step at a time
            seq = list(prompt[:-1])
            self.tap(len(seq) - reused, len(seq), logprobs_after(seq))
        seq.append(prompt[-1])
        for _ in range(n):
            lp = logprobs_after(seq)
            self.tap(1, len(seq), lp)
            seq.append(int(np.argmax(lp)))
        generated = seq[len(prompt) :]
        if self.cache:
            for end in range(self.block, len(seq) + 1, self.block):
                self.blocks.add(tuple(seq[:end]))
        claimed = reused + (self.block if reused and self.fault == "api-overclaim" else 0)
        self.total_cached += reused + (self.block if self.fault == "stats-overclaim" else 0)
        return {
            "id": "chatcmpl-standin",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": " ".join(map(str, generated))},
                    "finish_reason": "length",
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": n,
                "total_tokens": len(prompt) + n,
                "prompt_tokens_details": {"cached_tokens": claimed},
            },
        }


def handler(standin: Standin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            with standin.lock:
                if self.path == "/health":
                    self.send(200, {"status": "healthy"})
                elif self.path == "/api/status":
                    self.send(200, {"status": "ok", "total_cached_tokens": standin.total_cached})
                else:
                    self.send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            with standin.lock:
                if self.path == "/v1/chat/completions":
                    self.send(200, standin.complete(body))
                else:
                    self.send(404, {"detail": "Not Found"})

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(prog="omlx")
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve")
    serve.add_argument("--model-dir", required=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--no-cache", action="store_true")
    serve.add_argument("--hot-cache-max-size")
    serve.add_argument("--paged-ssd-cache-max-size")
    args = parser.parse_args(sys.argv[1:])
    level = logging.DEBUG if args.log_level in ("debug", "trace") else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
    settings_file = Path.home() / ".fmlx" / "settings.json"
    settings = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
    hot_only = bool(settings.get("cache", {}).get("hot_cache_only"))
    cache = not args.no_cache and not (hot_only and not args.hot_cache_max_size)
    block = SchedulerConfig().paged_cache_block_size
    if cache:
        log.info("paged SSD cache enabled: block_size=%d", block)
    else:
        log.info("oMLX cache disabled")
    fault = os.environ.get("OMLX_STANDIN_FAULT", "")
    standin = Standin(Path(args.model_dir), cache, block, fault)
    ThreadingHTTPServer((args.host, args.port), handler(standin)).serve_forever()
