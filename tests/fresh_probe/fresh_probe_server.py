"""A stdlib HTTP server that says what it has seen, for the fresh-server tests.

``python -m fresh_probe_server --port P [--exit CODE]``: ``GET /health``; ``POST /probe``
answers its pid, HOME, working directory and how many requests it served before this one;
``POST /persist`` writes a file under ``fresh_probe_lib.CACHE_DIR`` (a path computed at import
time). ``--exit CODE`` exits at once with CODE.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

import fresh_probe_lib

PREFIXCACHE_PRELOAD = ("fresh_probe_lib",)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def _reply(self, payload: dict[str, object]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._reply({"status": "ok"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/persist":
            os.makedirs(fresh_probe_lib.CACHE_DIR, exist_ok=True)
            with open(os.path.join(fresh_probe_lib.CACHE_DIR, "entry"), "w") as f:
                f.write(str(os.getpid()))
        seen = [f for _, _, fs in os.walk(fresh_probe_lib.CACHE_DIR) for f in fs]
        self._reply(
            {
                "pid": os.getpid(),
                "home": os.environ.get("HOME"),
                "cwd": os.getcwd(),
                "served_before": len(fresh_probe_lib.SERVED),
                "cache_entries": len(seen),
            }
        )
        fresh_probe_lib.SERVED.append(self.path)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--exit", type=int, default=None)
    args = p.parse_args()
    if args.exit is not None:
        return args.exit
    HTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
