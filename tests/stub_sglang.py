"""A stub HTTP server that answers like SGLang 0.5.23's OpenAI server, so CI needs no SGLang.

The toy model and prompt rendering are tests/stub_openai.py's (prompt ids are the template's
bytes, images a digest-keyed pad span); what differs is SGLang's shape (read in its
``serving_chat.py`` and ``protocol.py``):

- top_logprobs entries carry no token id: ``{token, logprob, bytes}``, where ``token`` is the
  detokenized display text (a byte fragment shows as U+FFFD) and ``bytes`` the token's raw
  bytes through GPT-2's byte decoder (byte-level BPE tokenizers). The stub's decode tokens are
  tiny-llama's: each toy id maps to a token of fixtures/tiny-llama, a third of them single
  bytes 0x80-0x9F, which all display as U+FFFD;
- ``return_token_ids``: the choice's ``prompt_token_ids`` and ``response_token_ids``;
- ``usage.prompt_tokens_details`` is ``{"cached_tokens": N}`` with ``--enable-cache-report``,
  else null; reuse is the longest cached page-aligned prefix (``--page-size``, default 1) of
  the prompt less its last token, keyed by ``cache_salt``; ``--disable-radix-cache`` caches
  nothing;
- ``GET|POST /flush_cache`` answers 200 with text (not JSON); ``GET /health`` an empty 200;
- ``GET /metrics`` (``--enable-metrics``): the counter ``sglang:cached_tokens_total``.

Faults (negative controls): ``display_bytes`` (``bytes`` are the UTF-8 of the display text,
as SGLang sends for tokenizers that are not byte-level: fragments cannot be told apart),
``flush_noop`` (the flush says "Cache flushed" and keeps the cache), ``flush_refused`` (400,
as SGLang answers while requests are pending), ``corrupt`` (a cache hit moves decode step 0's
logprobs by ``$STUB_CORRUPT``, default 1e-3), ``metric_overclaims`` (the counter
counts 4 tokens more than ``cached_tokens`` on every hit).

Run as a script: ``python stub_sglang.py --port P [--page-size N] [--disable-radix-cache]
[--enable-cache-report]`` (SGLang's other arguments are ignored; ``$STUB_FAULT``: the fault;
``$STUB_ARGV_LOG``: append the arguments, a JSON list per line).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from stub_openai import render, step_top

LLAMA = Path(__file__).resolve().parent.parent / "fixtures" / "tiny-llama" / "tokenizer.json"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable alphabet for the 256 bytes (as in its encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def llama_tokens() -> list[tuple[int, bytes]]:
    """95 (id, raw bytes) of tiny-llama, one per toy id 32..126: 32 single continuation
    bytes 0x80-0x9F (all display as U+FFFD) and 63 multi-character tokens."""
    vocab: dict[str, int] = json.loads(LLAMA.read_text(encoding="utf-8"))["model"]["vocab"]
    decode = {c: b for b, c in bytes_to_unicode().items()}
    fragments = [(vocab[bytes_to_unicode()[b]], bytes([b])) for b in range(0x80, 0xA0)]
    words = [(i, bytes(decode[c] for c in p)) for p, i in vocab.items() if len(p) > 2][:63]
    return fragments + words


class SGLangStub:
    """The toy model behind SGLang's radix cache (page-granular) and its reply shapes."""

    def __init__(self, page_size: int, radix: bool, report: bool, fault: str = "") -> None:
        self.page, self.radix, self.report, self.fault = max(page_size, 1), radix, report, fault
        self.tokens = llama_tokens()
        self.cache: set[str] = set()
        self.lock = threading.Lock()
        self.requests = 0
        self.cached_total = 0

    def _key(self, salt: str, ext: list[tuple[int, str]]) -> str:
        return json.dumps([salt, ext])

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        self.requests += 1
        ext = render(body["messages"])
        salt = str(body.get("cache_salt") or "")
        cached = 0
        with self.lock:
            if self.radix:
                limit = (len(ext) - 1) // self.page * self.page  # the last token is computed
                for end in range(self.page, limit + 1, self.page):
                    if self._key(salt, ext[:end]) not in self.cache:
                        break
                    cached = end
                for end in range(self.page, len(ext) + 1, self.page):
                    self.cache.add(self._key(salt, ext[:end]))
            self.cached_total += cached + (4 if cached and self.fault == "metric_overclaims" else 0)
        n = int(body.get("max_tokens") or 16)
        context = list(ext)
        tops: list[list[tuple[int, float]]] = []
        out: list[int] = []
        for _ in range(n):
            top = step_top(context)
            if cached and self.fault == "corrupt" and not tops:
                shift = float(os.environ.get("STUB_CORRUPT", "1e-3"))
                top = [(t, lp + shift) for t, lp in top]
            tops.append(top)
            out.append(top[0][0])
            context.append((top[0][0], ""))
        return self._reply(body, ext, cached, out, tops)

    def _entry(self, toy: int, lp: float) -> dict[str, Any]:
        raw = self.tokens[toy - 32][1]
        text = raw.decode("utf-8", errors="replace")
        shown = list(text.encode()) if self.fault == "display_bytes" else list(raw)
        return {"token": text, "bytes": shown, "logprob": lp}

    def _reply(
        self,
        body: dict[str, Any],
        ext: list[tuple[int, str]],
        cached: int,
        out: list[int],
        tops: list[list[tuple[int, float]]],
    ) -> dict[str, Any]:
        content = []
        for toy, top in zip(out, tops):
            entry = self._entry(toy, dict(top)[toy])
            entry["top_logprobs"] = [self._entry(t, lp) for t, lp in top[: body["top_logprobs"]]]
            content.append(entry)
        text = b"".join(self.tokens[t - 32][1] for t in out).decode("utf-8", errors="replace")
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": {"content": content} if body.get("logprobs") else None,
            "finish_reason": "length",
            "matched_stop": None,
        }
        if body.get("return_token_ids") or body.get("return_prompt_token_ids"):
            choice["prompt_token_ids"] = [t for t, _ in ext]
        if body.get("return_token_ids"):
            choice["response_token_ids"] = [self.tokens[t - 32][0] for t in out]
        usage = {
            "prompt_tokens": len(ext),
            "total_tokens": len(ext) + len(out),
            "completion_tokens": len(out),
            "prompt_tokens_details": {"cached_tokens": cached} if self.report else None,
        }
        return {"id": "x", "object": "chat.completion", "choices": [choice], "usage": usage}

    def flush(self) -> tuple[int, str]:
        if self.fault == "flush_refused":
            return 400, "Cache not flushed because there are pending requests.\n"
        if self.fault != "flush_noop":
            with self.lock:
                self.cache.clear()
        return 200, "Cache flushed.\nPlease check backend logs for more details.\n"


class Handler(BaseHTTPRequestHandler):
    server: Any

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, payload: Any) -> None:
        if isinstance(payload, str):
            raw, kind = payload.encode(), "text/plain"
        else:
            raw, kind = (
                (b"" if payload is None else json.dumps(payload).encode()),
                "application/json",
            )
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _route(self, method: str) -> None:
        stub: SGLangStub = self.server.stub
        path = self.path.split("?")[0]
        if path == "/flush_cache":
            self._send(*stub.flush())
        elif path == "/health" and method == "GET":
            self._send(200, None)
        elif path == "/metrics" and method == "GET":
            total = stub.cached_total
            self._send(200, f'sglang:cached_tokens_total{{cache_source="total"}} {total}.0\n')
        elif path == "/v1/chat/completions" and method == "POST":
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(200, stub.complete(json.loads(raw or b"{}")))
        else:
            self._send(404, {"detail": "Not Found"})

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")


def serve(
    page_size: int = 1, radix: bool = True, report: bool = True, fault: str = ""
) -> ThreadingHTTPServer:
    """A stub on 127.0.0.1 with an ephemeral port, served by a daemon thread;
    ``shutdown()`` and ``server_close()`` it when done."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.stub = SGLangStub(page_size, radix, report, fault)  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


if __name__ == "__main__":  # SGLang's other arguments are ignored
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--disable-radix-cache", action="store_true")
    ap.add_argument("--enable-cache-report", action="store_true")
    a, _ = ap.parse_known_args()
    if os.environ.get("STUB_ARGV_LOG"):
        with open(os.environ["STUB_ARGV_LOG"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps(sys.argv[1:]) + "\n")
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    srv.stub = SGLangStub(  # type: ignore[attr-defined]
        a.page_size,
        not a.disable_radix_cache,
        a.enable_cache_report,
        os.environ.get("STUB_FAULT", ""),
    )
    srv.serve_forever()
