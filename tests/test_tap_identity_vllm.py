"""Identity at the batch boundary for vllm-mlx 0.6.0 and rapid-mlx (tap/identity_vllm.py): the
exchange's header (``X-Prefixcache-Request``) is tied at admission to the scheduler's uid, and
the forward calls of its batch classes are labelled with their rows' uids. The classes are
stood in for (their methods as vllm-mlx 0.6.0 names them); the real engines are measured by
engines/seed/run.sh (docs/engines.md)."""

from __future__ import annotations

import asyncio
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from test_tap_identity import SAME, ledger, row

from pytest_prefixcache.tap import identity, identity_vllm

PID = os.getpid()


class Sink:
    def __init__(self) -> None:
        self.admitted: list[tuple[str, str]] = []

    def admit(self, label: str, reply_id: str, scheduler: str) -> None:
        self.admitted.append((label, reply_id))


def scope(value: str | None) -> dict[str, Any]:
    headers = [(b"content-type", b"application/json")]
    if value is not None:
        headers.append((b"x-prefixcache-request", value.encode()))
    return {"type": "http", "headers": headers}


def install(monkeypatch: pytest.MonkeyPatch, **modules: types.ModuleType) -> tuple[Sink, list[str]]:
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # install adds an import hook
    for name, mod in modules.items():
        monkeypatch.setitem(sys.modules, name.replace("__", "."), mod)
    sink = Sink()
    return sink, identity.install(sink)


def module(name: str, **classes: type) -> types.ModuleType:
    mod = types.ModuleType(name)
    for key, cls in classes.items():
        setattr(mod, key, cls)
    return mod


def test_text_requests_are_admitted_under_their_header_whichever_side_comes_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two exchanges through the FastAPI stand-in: the first is inserted into the batch
    generator before ``add_request`` returns its id, the second after; each is admitted under
    its own header with its ``batch_uid``'s label. An exchange without the header is not."""

    class App:
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await receive(scope)

    class Request:
        def __init__(self, rid: str) -> None:
            self.request_id = rid
            self.batch_uid: int | None = None

    class Scheduler:
        def __init__(self) -> None:
            self.batch_generator = types.SimpleNamespace()
            self.waiting: list[Request] = []
            self.count = 0

        def _schedule_waiting(self) -> list[Request]:
            out, self.waiting = self.waiting, []
            for r in out:
                r.batch_uid, self.count = self.count, self.count + 1
            return out

    class EngineCore:
        def __init__(self, scheduler: Scheduler) -> None:
            self.scheduler = scheduler

        async def add_request(self, prompt: Any, early: bool = False) -> str:
            rid = f"engine-{prompt}"
            self.scheduler.waiting.append(Request(rid))
            if early:  # the engine loop inserts it before this returns
                self.scheduler._schedule_waiting()
            return rid

    sink, done = install(
        monkeypatch,
        fastapi__applications=module("fastapi.applications", FastAPI=App),
        vllm_mlx__engine_core=module("vllm_mlx.engine_core", EngineCore=EngineCore),
        vllm_mlx__scheduler=module("vllm_mlx.scheduler", Scheduler=Scheduler),
    )
    assert "vllm_mlx.scheduler:Scheduler._schedule_waiting" in done
    assert "fastapi.applications:FastAPI.__call__" in done
    sched = Scheduler()
    core = EngineCore(sched)

    def exchange(value: str | None, prompt: str, early: bool) -> None:
        async def endpoint(_: Any) -> None:
            await core.add_request(prompt, early=early)

        asyncio.run(App()(scope(value), endpoint, None))

    exchange("hdr-a", "a", early=True)
    exchange("hdr-b", "b", early=False)
    exchange(None, "c", early=False)
    sched._schedule_waiting()
    gen = sched.batch_generator._prefixcache_serial  # type: ignore[attr-defined]
    assert sink.admitted == [(f"{PID}:{gen}:0", "hdr-a"), (f"{PID}:{gen}:1", "hdr-b")]


def test_mllm_rows_are_labelled_per_request_at_prefill_and_by_the_batch_at_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The MLLM batch generator stood in for: ``_process_prompts`` prefills its requests one
    at a time (each call labelled with the request it iterates, a failed request removed from
    the caller's list), ``_step`` decodes ``active_batch``'s rows in order, and a chunk after
    ``_language_model_kwargs(request)`` is that request's, once."""
    seen: list[list[str] | None] = []

    def forward() -> None:
        seen.append(identity.current_labels())

    class Req:
        def __init__(self, rid: str) -> None:
            self.request_id, self.uid = rid, -1

    class Batch:
        def __init__(self, uids: list[int]) -> None:
            self.uids = uids

    class Gen:
        def __init__(self) -> None:
            self.uid_counter = 0
            self.active_batch: Batch | None = None

        def insert(self, requests: list[Req]) -> list[int]:
            for r in requests:
                r.uid, self.uid_counter = self.uid_counter, self.uid_counter + 1
            return [r.uid for r in requests]

        def _process_prompts(self, requests: list[Req]) -> Batch:
            for _r in requests:  # preprocessing: no forward
                pass
            for r in list(requests):
                if r.request_id == "bad":
                    requests.remove(r)
            for _r in requests:
                forward()
                forward()
            return Batch([r.uid for r in requests])

        def _step(self, tokens: Any) -> None:
            forward()

        @staticmethod
        def _language_model_kwargs(request: Req, start: int = 0, end: int = 0) -> dict:
            return {}

    sink, done = install(
        monkeypatch,
        vllm_mlx__mllm_batch_generator=module(
            "vllm_mlx.mllm_batch_generator", MLLMBatchGenerator=Gen
        ),
    )
    assert "vllm_mlx.mllm_batch_generator:MLLMBatchGenerator._language_model_kwargs" in done
    gen = Gen()
    reqs = [Req("x"), Req("bad"), Req("y")]
    gen.insert(reqs)
    g = gen._prefixcache_serial  # type: ignore[attr-defined]
    x, y = f"{PID}:{g}:0", f"{PID}:{g}:2"
    gen.active_batch = gen._process_prompts(reqs)
    assert [r.request_id for r in reqs] == ["x", "y"]  # the removal reached the caller
    gen._step(None)
    gen.active_batch.uids = [2]  # x finished
    gen._step(None)
    Gen._language_model_kwargs(reqs[1], 0, 32)  # a chunk of y (chunked prefill)
    forward()
    forward()  # the next call is no one's
    assert seen == [[x], [x], [y], [y], [x, y], [y], [y], None]
    assert identity.current_labels() is None
    assert sink.admitted == []  # no exchange tied them: nothing admitted


def test_a_batch_that_keeps_the_prefilled_list_leaves_no_label_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vllm-mlx 0.6.0's ``_process_prompts`` keeps the list it was given as the batch's
    ``requests`` and the decode loop iterates it at every step. Seen on a lone chunked
    ``--mllm`` request after another one (the decode-KV probe): the next request's chunked
    prefill was labelled as the earlier request's, and its reply found no row ending at its
    prompt length (60). A chunk after ``_language_model_kwargs(request)`` is that request's
    (the control: the same calls before the decode loop's iteration were labelled right)."""
    seen: list[list[str] | None] = []

    class Req:
        def __init__(self, uid: int) -> None:
            self.request_id, self.uid = f"r{uid}", uid

    class Gen:
        def insert(self, requests: list[Req]) -> list[int]:
            return [r.uid for r in requests]

        def _process_prompts(self, requests: list[Req]) -> list[Req]:
            for _r in requests:
                seen.append(identity.current_labels())
            return requests  # MLLMBatch(requests=requests)

        @staticmethod
        def _language_model_kwargs(request: Req, start: int = 0, end: int = 0) -> dict:
            return {}

    install(
        monkeypatch,
        vllm_mlx__mllm_batch_generator=module(
            "vllm_mlx.mllm_batch_generator", MLLMBatchGenerator=Gen
        ),
    )
    gen = Gen()
    first, second = Req(0), Req(1)
    gen.insert([first])
    gen.insert([second])
    g = gen._prefixcache_serial  # type: ignore[attr-defined]
    kept = gen._process_prompts([first])
    for _r in kept:  # the decode loop's responses, after the prefill returned
        pass
    Gen._language_model_kwargs(second, 0, 32)  # the first chunk of the next request
    seen.append(identity.current_labels())
    seen.append(identity.current_labels())  # the next call outside any hook is no one's
    assert seen == [[f"{PID}:{g}:0"], [f"{PID}:{g}:1"], None]


def test_no_hooks_for_a_fastapi_server_that_is_not_vllm_mlx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class App:
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None: ...

    monkeypatch.delitem(sys.modules, "vllm_mlx", raising=False)
    for name in [n for n in sys.modules if n.startswith("vllm_mlx")]:
        monkeypatch.delitem(sys.modules, name)
    _, done = install(
        monkeypatch, fastapi__applications=module("fastapi.applications", FastAPI=App)
    )
    assert not any(d.startswith("fastapi") for d in done)
    assert not getattr(App.__call__, "__prefixcache_identity__", False)


def test_the_ledger_finds_a_reply_by_its_header_among_the_ids_tried(tmp_path: Path) -> None:
    """Two identical prompts in flight, admitted under their headers: a reply gets its own
    track by its header (the reply's own id unknown to the tap), ``id``; tried by a reply id
    alone, the same reply is guessed (and here crossed: the negative control)."""
    a, b = "1:1:0", "1:1:1"
    lines: list[Any] = [
        ("hdr-x", a),
        ("hdr-y", b),
        ("p", [row(0, 6, SAME, 3, a), row(0, 6, SAME, 4, b, shift=0.01)]),
    ]
    led = ledger(tmp_path, lines)
    found = led.find(6, SAME, 1, reply_id=("hdr-y", "chatcmpl-123"))
    assert found is not None and found.attribution == "id" and found.greedy[0] == 4
    (tmp_path / "bare").mkdir()
    bare = ledger(tmp_path / "bare", [lines[2]])
    guessed = bare.find(6, SAME, 1, reply_id="chatcmpl-123")
    assert guessed is not None and guessed.attribution == "guessed" and guessed.greedy[0] == 3


def test_the_client_sends_the_header_the_hooks_read() -> None:
    assert identity.REQUEST_HEADER == identity_vllm.REQUEST_HEADER == "X-Prefixcache-Request"


SEED_VENV = Path(os.environ.get("SEED_DIR") or Path(__file__).parent.parent / ".engines" / "seed")


@pytest.mark.slow
@pytest.mark.skipif(
    not (SEED_VENV / "vllm-mlx" / "bin" / "python").exists(),
    reason="needs vllm-mlx 0.6.0's venv (engines/seed/run.sh install vllm-mlx)",
)
def test_vllm_mlx_chunked_mllm_wave_is_attributed_by_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wave the guessing ledger crossed in 5 of 6 tries (vllm-mlx --mllm with chunked
    prefill: [A] x3 and [B], the same text): every reply by id, each equal to its request
    served alone, one prefill per reply."""
    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("PYTHONPATH", str(root))  # the server imports this checkout's tap
    monkeypatch.setenv("SEED_DIR", str(SEED_VENV))
    from pytest_prefixcache import Verifier
    from pytest_prefixcache.adapters.seed import seed_server
    from pytest_prefixcache.checks.coverage import ATTRIBUTION
    from pytest_prefixcache.output.streams import load_stream, waves_from

    stream, meta = load_stream(root / "benchmarks/results/seed_claims/chunked_tap_wave/stream.json")
    waves = waves_from(stream, meta)
    assert waves is not None
    flags = ["--continuous-batching", "--mllm", "--chunked-prefill-tokens", "32"]
    with seed_server("vllm-mlx", flags, concurrency=4, audit=False, claims=False) as engine:
        verifier = Verifier(engine)
        steps = verifier.run_waves(waves)
        assert {s.cached.attribution for s in steps} == {"id"}
        assert verifier.report.coverage[ATTRIBUTION] == {"applied": len(steps)}
        assert engine.request_count_problems() == []
