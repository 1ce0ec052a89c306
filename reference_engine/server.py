"""A small OpenAI-compatible HTTP front end for the reference engine (stdlib ``http.server``).

Endpoints (the API itself, requests and replies, lives in ``reference_engine.openai_api``):

- ``POST /v1/chat/completions``: ``messages`` (text, or parts with ``image_url`` data URLs;
  roles ``system``, ``developer`` (as ``system``), ``user``, ``assistant`` with ``tool_calls``
  and ``tool``, rendered as ``openai_api.messages`` says), ``max_tokens`` or
  ``max_completion_tokens`` (default 16), ``logprobs``, ``top_logprobs`` (0-20), ``stop``,
  ``stream`` and ``stream_options.include_usage``. The reply carries
  ``logprobs.content[i].top_logprobs`` sorted by logprob, each with its token ``id``, and
  ``usage.prompt_tokens_details.cached_tokens``.
- ``POST /v1/completions``: ``prompt`` as the exact prompt text (no chat template), the same
  fields, ``logprobs`` as the legacy integer (0-5).
- ``GET /v1/models`` (and ``/v1/models/ID``): one model, its id the model directory's name
  or ``--served-model-name``; replies name it whatever ``model`` a request gives (not checked).
- ``GET /health``, ``GET /v1/cache/stats``, ``POST /v1/cache/reset``.

A completion reply (not streamed) has a ``Server-Timing: engine;dur=MS`` header: the
milliseconds the engine's ``run`` took (render, prefill, decode) for it.

Decoding is greedy: sampling fields are accepted only with values that mean greedy
(``temperature`` 0, ``n`` 1, ...) and refused with HTTP 400 naming the field otherwise
(``openai_api.params``). ``seed`` is accepted (a greedy decode is the same under every seed);
``tools`` are refused. Errors have the OpenAI shape ``{"error": {"message", "type", "param",
"code"}}``. A stream (server-sent events ``data: {...}``, then ``data: [DONE]``) is the
finished reply cut into one chunk per token. The ``x-prefixcache-namespace`` header (or a
``namespace`` or vLLM's ``cache_salt`` body field) sets the request's cache namespace; a
``model`` naming one of the adapters (``--adapter NAME=DIR``) runs the request with it.

A body field ``"prefixcache": {"logits": true}`` adds a ``prefixcache`` object to the reply
(to the chunk with ``finish_reason`` when streaming): the prompt's token ids, image spans and
vision merges, and the full float32 logits of every step (base64), so an HTTP client can
compare exactly.

Run ``python -m reference_engine.server --model DIR --host 127.0.0.1 --port 0``; it prints
``listening on http://HOST:PORT`` once it accepts connections.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pytest_prefixcache.errors import PrefixCacheError
from pytest_prefixcache.package_data import resolve_model
from pytest_prefixcache.traits import traits_of
from pytest_prefixcache.types import Outcome

from . import env_model_path
from .disk import DEFAULT_DISK_BYTES
from .engine import Engine
from .kvquant import KVQuant
from .lora import parse_adapters
from .model import load_model
from .openai_api import (
    ENDPOINTS,
    APIError,
    build_request,
    chat_completion,
    check_sampling,
    extension,
    generated,
    stop_strings,
    stream_usage,
)

__all__ = [
    "NAMESPACE_HEADER",
    "build_request",
    "completion",
    "extension",
    "main",
    "make_server",
]

NAMESPACE_HEADER = "x-prefixcache-namespace"

#: What ``main`` imports lazily (the model loader's package): a fork server
#: (``pytest_prefixcache.adapters.http.forkserver``) imports it once before forking fresh servers.
PREFIXCACHE_PRELOAD = ("mlx_vlm",)


def completion(
    out: Outcome, body: dict[str, Any], tokenizer: Any, model: str, eos: frozenset[int]
) -> dict[str, Any]:
    """The OpenAI chat completion reply for an engine Outcome."""
    gen = generated(out, tokenizer, eos, stop_strings(body))
    return chat_completion(out, gen, body, tokenizer, model)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet by default
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, status: int, payload: dict[str, Any], engine_s: float | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if engine_s is not None:  # the time inside the engine's run (render, prefill, decode)
            self.send_header("Server-Timing", f"engine;dur={engine_s * 1000:.3f}")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: Iterable[dict[str, Any]]) -> None:
        """Server-sent events, one ``data:`` line each, then ``data: [DONE]`` (chunked)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        lines = [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]
        try:
            for line in lines:
                self.wfile.write(b"%X\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading
            self.close_connection = True

    def _not_found(self, what: str) -> None:
        self._send(404, APIError(f"Invalid URL ({what})", status=404).body())

    def _models(self) -> list[dict[str, Any]]:
        s = self.server
        return [
            {
                "id": s.model_name,
                "object": "model",
                "created": s.created,
                "owned_by": "reference_engine",
            }
        ]

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        if path == "/health":
            self._send(200, {"status": "ok"})
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": self._models()})
        elif path.startswith("/v1/models/"):
            model = self._models()[0]
            if path.removeprefix("/v1/models/") != model["id"]:
                error = APIError(
                    f"The model {path[11:]!r} does not exist; this server has {model['id']!r}",
                    status=404,
                    param="model",
                    code="model_not_found",
                )
                self._send(404, error.body())
            else:
                self._send(200, model)
        elif path == "/v1/cache/stats":
            stats = self.server.call(lambda: self.server.engine.stats)
            self._send(200, dataclasses.asdict(stats))
        else:
            self._not_found(f"GET {path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        path = self.path.partition("?")[0]
        if path == "/v1/cache/reset":
            self.server.call(self.server.engine.reset)
            self._send(200, {"status": "ok"})
            return
        if path not in ENDPOINTS:
            self._not_found(f"POST {path}")
            return
        try:
            stream, payload, engine_s = self._complete(path, raw)
        except APIError as exc:
            self._send(exc.status, exc.body())
            return
        except PrefixCacheError as exc:  # a request the engine cannot render
            self._send(400, APIError(str(exc)).body())
            return
        except Exception as exc:  # the engine failed: say so, keep serving
            error = APIError(f"{type(exc).__name__}: {exc}", status=500, type="server_error")
            self._send(500, error.body())
            return
        if stream:
            self._stream(payload)
        else:
            self._send(200, payload, engine_s)

    def _complete(self, path: str, raw: bytes) -> tuple[bool, Any, float]:
        """(streamed?, the reply or its chunks, seconds in the engine's run) of a completion
        request; raises APIError."""
        route = ENDPOINTS[path]
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            raise APIError(f"the body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise APIError("the body must be a JSON object")
        check_sampling(body)
        stream_usage(body)  # checks stream and stream_options before the engine runs
        stop = stop_strings(body)
        route.check(body)
        request = route.request(body, self.headers.get(NAMESPACE_HEADER, ""))
        s, model = self.server, self.server.engine.model
        if body.get("model") in traits_of(s.engine).adapters:  # vLLM's way: the adapter's name
            request = dataclasses.replace(request, adapter=str(body["model"]))
        # Chat requests call run() as before, so engines overriding it without ``template``
        # (mutants, test doubles) still serve them.
        flags = {} if route.template else {"template": False}
        out, engine_s = s.call(_timed, s.engine.run, request, use_cache=True, **flags)
        gen = generated(out, model.tokenizer, model.eos_token_ids, stop)
        args = (out, gen, body, model.tokenizer, s.model_name)
        if body.get("stream"):
            return True, list(route.chunks(*args)), engine_s
        return False, route.reply(*args), engine_s


#: The clock of the Server-Timing header.
_clock = time.perf_counter


def _timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = _clock()
    out = fn(*args, **kwargs)
    return out, _clock() - start


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, addr: tuple[str, int], engine: Engine, model_name: str, verbose: bool
    ) -> None:
        # Engine calls run on long-lived worker threads (a thread that ran MLX work and ended
        # can abort the interpreter at exit): one per request the engine serves at once (its
        # max_concurrency; the reference engine interleaves them, bit-exact). Made before the
        # bind, which calls server_close() when it fails (a busy port).
        workers = getattr(engine, "max_concurrency", 1)
        workers = workers if isinstance(workers, int) and workers > 0 else 1
        self._worker = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="engine")
        super().__init__(addr, _Handler)
        self.engine = engine
        self.model_name = model_name
        self.verbose = verbose
        self.created = int(time.time())

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


def parser() -> argparse.ArgumentParser:
    """The command line (every option's help names its default)."""
    p = argparse.ArgumentParser(
        prog="python -m reference_engine.server",
        description="OpenAI-compatible HTTP server for the reference engine",
    )
    p.add_argument(
        "--model",
        default=None,
        metavar="DIR|NAME",
        help="Model directory, or a shipped fixture's name (default: $PREFIXCACHE_MODEL, else "
        "the tiny Qwen2-VL fixture)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="Model id in /v1/models and replies (default: the model directory's name)",
    )
    p.add_argument("--host", default="127.0.0.1", help="Address to bind (default: %(default)s)")
    p.add_argument(
        "--port",
        type=int,
        default=8080,
        help="Port to bind, 0 for any free port (default: %(default)s)",
    )
    p.add_argument(
        "--block-size", type=int, default=16, help="Tokens per cache block (default: %(default)s)"
    )
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="Keep a disk tier of the prefix cache in DIR: a server started again with the "
        "same DIR restores what this one stored (default: none, memory only)",
    )
    p.add_argument(
        "--disk-bytes",
        type=int,
        default=DEFAULT_DISK_BYTES,
        help="Byte budget of the disk tier (default: %(default)s)",
    )
    p.add_argument(
        "--kv-bits",
        type=int,
        default=None,
        help="Quantize the KV rows to this many bits, as mlx_lm.server's flag (default: "
        "$PREFIXCACHE_REFERENCE_KV_BITS, else off)",
    )
    p.add_argument(
        "--kv-group-size",
        type=int,
        default=0,
        help="Values per quantization group along the head dim (default: min(64, head dim))",
    )
    p.add_argument(
        "--quantized-kv-start",
        type=int,
        default=0,
        help="First position whose KV rows are quantized (default: %(default)s)",
    )
    p.add_argument(
        "--adapter",
        action="append",
        metavar="NAME=DIR",
        help="A LoRA adapter requests name as their model, repeatable (default: "
        "$PREFIXCACHE_REFERENCE_ADAPTERS, else none)",
    )
    p.add_argument("--verbose", action="store_true", help="Log every request (default: off)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        path = resolve_model(args.model) if args.model else env_model_path()
    except PrefixCacheError as exc:
        parser().error(str(exc))
    if args.disk_bytes <= 0:
        parser().error(f"--disk-bytes must be a positive number of bytes, got {args.disk_bytes}")
    try:
        kv_quant = (
            None
            if args.kv_bits is None
            else KVQuant(args.kv_bits, args.kv_group_size, args.quantized_kv_start)
        )
        disk = {} if args.cache_dir is None else {"cache_dir": args.cache_dir}
        adapters = parse_adapters(args.adapter or [], "--adapter") or None  # None: the env's
        engine = Engine(load_model(path), block_size=args.block_size, **disk, adapters=adapters,
                        disk_bytes=args.disk_bytes, kv_quant=kv_quant)  # fmt: skip
    except (ValueError, PrefixCacheError) as exc:  # the block size, a cache dir, KV bits
        parser().error(str(exc))
    name = args.served_model_name or path.resolve().name
    try:
        server = make_server(engine, args.host, args.port, model_name=name, verbose=args.verbose)
    except OSError as exc:  # e.g. "[Errno 98] Address already in use"
        print(f"cannot listen on {args.host}:{args.port} (port {args.port}): {exc}", flush=True)
        return 1
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
