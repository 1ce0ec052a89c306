"""mlx_vlm.server's rows by id: the hooks of tap/identity_vlm.py on stand-ins for mlx-vlm's
classes (fast), and on the real server with three requests in flight (slow)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from pytest_prefixcache.tap import identity, identity_vlm


def _modules(monkeypatch: pytest.MonkeyPatch, seen: list[list[str] | None]) -> dict[str, Any]:
    class Batch:
        def __init__(self, uids: list[int]) -> None:
            self.uids = uids

        def prompt_step(self) -> None:
            seen.append(identity.current_labels())

        def generate(self) -> None:
            seen.append(identity.current_labels())

        def _step(self) -> None:
            seen.append(identity.current_labels())

    class Generator:
        def __init__(self) -> None:
            self.uid_count, self.batch = 0, Batch([])

        def _next(self) -> None:
            self.batch.prompt_step()

        def insert(self, prompts: list[Any], **kw: Any) -> list[int]:
            uids = list(range(self.uid_count, self.uid_count + len(prompts)))
            self.uid_count += len(prompts)
            self.batch.uids.extend(uids)
            return uids

    class Context:
        def __init__(self, uid: int) -> None:
            self.uid = uid

    class Responder:
        def __init__(self, gen: Generator) -> None:
            self.gen = gen

        def generate(self, **kw: Any) -> tuple[Context, None]:
            (uid,) = self.gen.insert([[1, 2]])
            return Context(uid), None

    class App:  # FastAPI's __call__ through mlx-vlm's @app.middleware("http"): the whole
        # body with more to come, then an empty last part (content-length declared or not)
        def __init__(self, responder: Responder, reply_id: str, declared: bool = True) -> None:
            self.responder, self.reply_id, self.declared = responder, reply_id, declared

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await asyncio.to_thread(self.responder.generate)
            body = json.dumps({"id": self.reply_id, "object": "chat.completion"}).encode()
            size = [(b"content-length", str(len(body)).encode())] if self.declared else []
            await send({"type": "http.response.start", "status": 200, "headers": size})
            await send({"type": "http.response.body", "body": body, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    ar = types.ModuleType("mlx_vlm.generate.ar")
    ar.PromptProcessingBatch = Batch  # type: ignore[attr-defined]
    ar.GenerationBatch = Batch  # type: ignore[attr-defined]
    ar.BatchGenerator = Generator  # type: ignore[attr-defined]
    gen = types.ModuleType("mlx_vlm.server.generation")
    gen.ResponseGenerator = Responder  # type: ignore[attr-defined]
    fastapi = types.ModuleType("fastapi.applications")
    fastapi.FastAPI = App  # type: ignore[attr-defined]
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for name, mod in (("mlx_vlm.generate.ar", ar), ("mlx_vlm.server.generation", gen),
                      ("fastapi.applications", fastapi)):  # fmt: skip
        monkeypatch.setitem(sys.modules, name, mod)
    return {"Generator": Generator, "Responder": Responder, "App": App}


@pytest.mark.parametrize("declared", [True, False])
def test_the_hooks_label_rows_and_admit_the_reply_id_before_it_is_sent(
    monkeypatch: pytest.MonkeyPatch, declared: bool
) -> None:
    """The admission goes before the part that completes the body: with a content-length,
    the first (a client holding the declared bytes does not wait for the empty last part,
    and an admission written then came after the client looked its id up: the waves'
    guessed replies); without one, the last."""
    seen: list[list[str] | None] = []
    classes = _modules(monkeypatch, seen)
    admitted: list[tuple[str, str]] = []
    sent: list[Any] = []

    class Sink:
        def admit(self, label: str, reply_id: str, scheduler: str) -> None:
            admitted.append((label, reply_id))
            sent.append(("admitted", reply_id))

    done = identity.install(Sink(), families=(identity_vlm.FAMILY,))
    assert "fastapi.applications:FastAPI.__call__ (reply id)" in done
    assert "mlx_vlm.server.generation:ResponseGenerator.generate" in done
    gen = classes["Generator"]()
    responder = classes["Responder"](gen)

    async def send(message: Any) -> None:
        sent.append(message.get("more_body", "start"))

    async def serve() -> None:
        for reply in ("chatcmpl-a", "chatcmpl-b"):
            scope = {"type": "http", "path": "/v1/chat/completions"}
            await classes["App"](responder, reply, declared)(scope, None, send)

    asyncio.run(serve())
    gen._next()
    pid, serial = os.getpid(), gen._prefixcache_serial
    assert admitted == [(f"{pid}:{serial}:0", "chatcmpl-a"), (f"{pid}:{serial}:1", "chatcmpl-b")]
    assert seen == [[f"{pid}:{serial}:0", f"{pid}:{serial}:1"]]
    if declared:  # before the body the client reads to its declared length
        assert sent[:4] == ["start", ("admitted", "chatcmpl-a"), True, False]
    else:  # before the last part, which ends a body of undeclared length
        assert sent[:4] == ["start", True, ("admitted", "chatcmpl-a"), False]
    assert len(admitted) == 2  # once per reply


def test_another_path_or_a_body_that_is_not_json_admits_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Negative control: /health, or a streamed reply, leaves the rows to the ledger."""
    classes = _modules(monkeypatch, [])
    admitted: list[str] = []

    class Sink:
        def admit(self, label: str, reply_id: str, scheduler: str) -> None:
            admitted.append(reply_id)

    identity.install(Sink(), families=(identity_vlm.FAMILY,))
    responder = classes["Responder"](classes["Generator"]())

    async def send(message: Any) -> None:
        pass

    asyncio.run(classes["App"](responder, "x")({"type": "http", "path": "/health"}, None, send))
    assert admitted == []


@pytest.mark.slow
def test_mlx_vlm_server_rows_in_flight_are_admitted_by_id(tmp_path: Path) -> None:
    """The real server under the tap, three requests of different lengths in flight: every
    reply id is admitted, and every row of every call carries its request's label."""
    pytest.importorskip("mlx_vlm")
    import subprocess
    import threading
    import time

    from pytest_prefixcache.adapters.http.server import http_json
    from pytest_prefixcache.package_data import FIXTURES

    root = str(Path(__file__).resolve().parents[1])
    tap = tmp_path / "tap.jsonl"
    env = {**os.environ, "PREFIXCACHE_TAP": str(tap), "APC_ENABLED": "1", "APC_DISK_ENABLED": "0",
           "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path), "PYTHONPATH": root}  # fmt: skip
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = str(FIXTURES / "tiny-qwen2-vl")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_prefixcache.tap", "mlx_vlm.server.cli:main", "--model",
         model, "--host", "127.0.0.1", "--port", str(port)],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                if http_json("GET", url + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                time.sleep(0.5)
        replies: list[str] = []

        def ask(text: str) -> None:
            body = {"model": model, "messages": [{"role": "user", "content": text}],
                    "max_tokens": 3, "temperature": 0}  # fmt: skip
            replies.append(
                http_json("POST", url + "/v1/chat/completions", body, timeout=120)[1]["id"]
            )

        texts = ("hi", "a b c d e f g h i j k l m n o p", "tell me about the weather today please")
        threads = [threading.Thread(target=ask, args=(t,)) for t in texts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lines = [json.loads(line) for line in tap.read_text().splitlines()]
    admitted = {d["reply"]: d["admit"] for d in lines if "admit" in d}
    assert sorted(admitted) == sorted(replies) and len(set(admitted.values())) == 3
    rows = [r for d in lines if "rows" in d for r in d["rows"]]
    assert rows and all(r.get("id") in admitted.values() for r in rows)
    assert any(d.get("batch", 1) > 1 for d in lines if "rows" in d), "requests were batched"
