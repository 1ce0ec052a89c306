"""A small OpenAI-compatible HTTP front end for the reference engine (stdlib ``http.server``).

Endpoints:

- ``POST /v1/chat/completions``: ``messages`` (text, or parts with ``image_url`` data URLs),
  ``max_tokens`` (default 16), ``logprobs``, ``top_logprobs`` (0-20); greedy decoding. The
  reply carries ``logprobs.content[i].top_logprobs`` sorted by logprob, each with its token
  ``id``, and ``usage.prompt_tokens_details.cached_tokens``. The ``x-prefixcache-namespace``
  header (or a ``namespace`` body field) sets the request's cache namespace.
- ``GET /health``, ``GET /v1/models``, ``GET /v1/cache/stats``, ``POST /v1/cache/reset``.

A body field ``"prefixcache": {"logits": true}`` adds a ``prefixcache`` object to the reply:
the prompt's token ids, image spans and vision merges, and the full float32 logits of every
step (base64), so an HTTP client can compare exactly.

Run ``python -m reference_engine.server --model DIR --host 127.0.0.1 --port 0``; it prints
``listening on http://HOST:PORT`` once it accepts connections.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import sys
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from pytest_prefixcache.adapters.chat import log_softmax
from pytest_prefixcache.errors import PrefixCacheError
from pytest_prefixcache.types import Image, Message, Outcome, Part, Request

from .engine import Engine, default_model_path

__all__ = [
    "NAMESPACE_HEADER",
    "build_request",
    "completion",
    "extension",
    "main",
    "make_server",
]

NAMESPACE_HEADER = "x-prefixcache-namespace"
MAX_TOP_LOGPROBS = 20


class BadRequest(ValueError):
    """The request body is not a chat completion this server can serve."""


def _image(url: Any) -> Image:
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str) or not url.startswith("data:") or "," not in url:
        raise BadRequest("images must be data URLs (data:image/png;base64,...)")
    try:
        return Image.open(base64.b64decode(url.partition(",")[2], validate=True))
    except (ValueError, PrefixCacheError) as exc:
        raise BadRequest(f"bad image data URL: {exc}") from None


def _parts(content: Any) -> tuple[Part, ...]:
    if isinstance(content, str):
        return (content,)
    if not isinstance(content, list):
        raise BadRequest("message content must be a string or a list of parts")
    parts: list[Part] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind in ("image_url", "input_image", "image"):
            parts.append(_image(part.get("image_url", part.get("image"))))
        else:
            raise BadRequest(f"unsupported content part {part!r:.80}")
    return tuple(parts)


def build_request(body: dict[str, Any], namespace: str = "") -> Request:
    """The engine Request for an OpenAI chat completion body."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 16))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise BadRequest(f"'max_tokens' must be an int >= 0, got {max_tokens!r}")
    try:
        msgs = tuple(Message(m.get("role"), _parts(m.get("content", ""))) for m in messages)
        return Request(
            msgs, namespace=str(body.get("namespace", namespace)), max_new_tokens=max_tokens
        )
    except (PrefixCacheError, AttributeError) as exc:
        raise BadRequest(str(exc)) from None


def _top(logprobs: np.ndarray, k: int, tokenizer: Any) -> list[dict[str, Any]]:
    order = np.argsort(-logprobs, kind="stable")[:k]
    return [
        {"token": tokenizer.decode([int(i)]), "id": int(i), "logprob": float(logprobs[i])}
        for i in order
    ]


def completion(
    out: Outcome, body: dict[str, Any], tokenizer: Any, model: str, eos: frozenset[int]
) -> dict[str, Any]:
    """The OpenAI chat completion reply for an engine Outcome."""
    k = body.get("top_logprobs") or 0
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_LOGPROBS:
        raise BadRequest(f"'top_logprobs' must be an int in [0, {MAX_TOP_LOGPROBS}], got {k!r}")
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": tokenizer.decode(list(out.tokens))},
        "finish_reason": "stop" if out.tokens and out.tokens[-1] in eos else "length",
        "logprobs": None,
    }
    if body.get("logprobs"):
        content = []
        for token, logits in zip(out.tokens, out.step_logits):
            lp = log_softmax(logits)
            content.append(
                {
                    "token": tokenizer.decode([token]),
                    "id": int(token),
                    "logprob": float(lp[token]),
                    "top_logprobs": _top(lp, k, tokenizer),
                }
            )
        choice["logprobs"] = {"content": content}
    n_prompt = out.prompt_tokens or 0
    reply: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": n_prompt,
            "completion_tokens": len(out.tokens),
            "total_tokens": n_prompt + len(out.tokens),
            "prompt_tokens_details": {"cached_tokens": out.cached_tokens or 0},
        },
    }
    ext = body.get("prefixcache")
    if isinstance(ext, dict):
        reply["prefixcache"] = extension(out, logits=bool(ext.get("logits")))
    return reply


def extension(out: Outcome, *, logits: bool) -> dict[str, Any]:
    """What only this server tells (asked for by ``"prefixcache": {"logits": true}`` in the
    body): prompt token ids, image spans, vision merges and, with ``logits``, the float32
    logits before each generated token as base64."""
    ext: dict[str, Any] = {
        "token_ids": list(out.token_ids or ()),
        "image_spans": [list(s) for s in out.image_spans or ()],
        "merges": [list(m) for m in out.merges or ()],
    }
    if logits:
        ext["step_logits"] = [
            base64.b64encode(np.asarray(x, dtype=np.float32).tobytes()).decode("ascii")
            for x in out.step_logits
        ]
    return ext


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet by default
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._send(
                200, {"object": "list", "data": [{"id": self.server.model_name, "object": "model"}]}
            )
        elif self.path == "/v1/cache/stats":
            stats = self.server.call(lambda: self.server.engine.stats)
            self._send(200, dataclasses.asdict(stats))
        else:
            self._send(404, {"error": {"message": f"no route GET {self.path}"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path == "/v1/cache/reset":
            self.server.call(self.server.engine.reset)
            self._send(200, {"status": "ok"})
            return
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"no route POST {self.path}"}})
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            if body.get("stream"):
                raise BadRequest("streaming is not supported")
            request = build_request(body, self.headers.get(NAMESPACE_HEADER, ""))
            s = self.server
            out = s.call(s.engine.run, request, use_cache=True)
            reply = completion(
                out, body, s.engine.model.tokenizer, s.model_name, s.engine.model.eos_token_ids
            )
        except (BadRequest, ValueError) as exc:
            self._send(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})
            return
        except Exception as exc:  # the engine failed: say so, keep serving
            self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
            return
        self._send(200, reply)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, addr: tuple[str, int], engine: Engine, model_name: str, verbose: bool
    ) -> None:
        super().__init__(addr, _Handler)
        self.engine = engine
        self.model_name = model_name
        self.verbose = verbose
        # MLX state is per thread: every engine call runs on this one worker thread.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self._worker.submit(fn, *args, **kwargs).result()

    def server_close(self) -> None:
        super().server_close()
        self._worker.shutdown(wait=False)


def make_server(
    engine: Engine,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    model_name: str = "reference",
    verbose: bool = False,
) -> ThreadingHTTPServer:
    """An HTTP server for ``engine`` bound to (host, port); call ``serve_forever()``."""
    return _Server((host, port), engine, model_name, verbose)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference_engine.server",
        description="OpenAI-compatible HTTP server for the reference engine",
    )
    parser.add_argument("--model", default=None, help="Model directory (default: tiny Qwen2-VL)")
    parser.add_argument("--host", default="127.0.0.1", help="Address to bind")
    parser.add_argument("--port", type=int, default=8080, help="Port to bind (0: any free port)")
    parser.add_argument("--block-size", type=int, default=16, help="Tokens per cache block")
    parser.add_argument("--verbose", action="store_true", help="Log every request")
    args = parser.parse_args(argv)
    path = args.model or default_model_path()
    engine = Engine.from_pretrained(path, block_size=args.block_size)
    server = make_server(engine, args.host, args.port, model_name=str(path), verbose=args.verbose)
    host, port = server.server_address[:2]
    print(f"listening on http://{host!s}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
