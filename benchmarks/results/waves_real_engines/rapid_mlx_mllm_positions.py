"""rapid-mlx 0.16.10 --mllm keeps M-RoPE positions across requests: raw HTTP, no logit tap.

Run from a checkout whose .venv has Pillow, with the seed engines in SEED_DIR:
    SEED_DIR=<main>/.engines/seed python \
        benchmarks/results/waves_real_engines/rapid_mlx_mllm_positions.py
Output: rapid_mlx_mllm_positions.txt beside this file (top-3 logprobs of the first token, or the
HTTP status and message). Each server gets a fresh HOME under $SCRATCH (default ./scratch)."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[3]
PY = str(Path(os.environ["SEED_DIR"]) / "rapid-mlx" / "bin" / "python")
MODEL = str(ROOT / "fixtures" / "tiny-qwen2-vl")
SCRATCH = Path(os.environ.get("SCRATCH", "scratch")).resolve()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, flags: list[str]) -> None:
        self.port = free_port()
        home = SCRATCH / f"home-{self.port}"
        (home / "tmp").mkdir(parents=True)
        env = dict(
            os.environ,
            HOME=str(home),
            TMPDIR=str(home / "tmp"),
            HF_HUB_OFFLINE="1",
            RAPID_MLX_TELEMETRY="0",
            DO_NOT_TRACK="1",
        )
        cmd = [
            PY,
            "-m",
            "rapid_mlx.cli",
            "serve",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--mllm",
            *flags,
        ]
        self.log = open(home / "server.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=5)
                return
            except OSError:
                time.sleep(1)
        raise RuntimeError("the server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()

    def chat(self, messages: list) -> object:
        body = {
            "model": MODEL,
            "messages": messages,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 3,
        }
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/chat/completions",
            json.dumps(body).encode(),
            {"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}").get("error", {}).get("message")
        top = out["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        return out["usage"]["prompt_tokens"], [(t["token"], round(t["logprob"], 5)) for t in top]

    def wave(self, batch: list[list]) -> list[object]:
        out: list[object] = [None] * len(batch)
        threads = [
            threading.Thread(target=lambda i=i: out.__setitem__(i, self.chat(batch[i])))
            for i in range(len(batch))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out


def text(n: int) -> list:
    return [{"role": "user", "content": ", ".join(["describe the image"] * n)}]


def with_image(n: int) -> list:
    buf = io.BytesIO()
    Image.new("RGB", (56, 56), (200, 30, 30)).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    words = ", ".join(["describe the image"] * n)
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": words},
            ],
        }
    ]


def main() -> None:
    lines = []
    short, long, image = text(5), text(12), with_image(12)
    for flags in (["--disable-prefix-cache"], []):
        s = Server(flags)
        try:
            lines.append(f"# fresh server, flags {flags}")
            lines.append(f"two long text requests in flight first: {s.wave([long, long])}")
            lines.append(f"short text: {s.chat(short)}")
            lines.append(f"long text: {s.chat(long)}")
        finally:
            s.stop()
        s = Server(flags)
        try:
            lines.append(f"# fresh server, flags {flags}")
            lines.append(f"short text: {s.chat(short)}")
            lines.append(f"long text after it: {s.chat(long)}")
            lines.append(f"two long text requests in flight: {s.wave([long, long])}")
            lines.append(f"image request, longer prompt: {s.chat(image)}")
            lines.append(f"short text after it: {s.chat(short)}")
            lines.append(f"two short text requests in flight: {s.wave([short, short])}")
        finally:
            s.stop()
    Path(__file__).with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
