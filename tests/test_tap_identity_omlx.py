"""Identity at the batch boundary for oMLX (tap/identity_omlx.py): a request's external prefill
and its BatchGenerator rows carry one label, ``PID:omlx:REQUEST_ID``, admitted under the
client's ``X-Prefixcache-Request`` header by ``EngineCore.add_request``. oMLX's classes are
stood in for (their methods as flyto-mlx 0.7.0 names them); the real server is measured by
engines/omlx/verify.sh (its ``*-waves`` configurations, engines/omlx/NOTES.md)."""

from __future__ import annotations

import asyncio
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from test_tap_identity import SAME, ledger, reply, row
from test_tap_identity_vllm import module, scope

from pytest_prefixcache.adapters.http.tapped import apply_tap
from pytest_prefixcache.tap import identity, identity_omlx, identity_vlm
from pytest_prefixcache.tap.identity_omlx import label

PID = os.getpid()


def stand_ins(seen: list[list[str] | None]) -> dict[str, types.ModuleType]:
    """mlx-lm's batch classes and oMLX's scheduler, engine core and FastAPI app, each forward
    call recording the labels it sees."""

    def forward() -> None:
        seen.append(identity.current_labels())

    class Batch:
        def __init__(self) -> None:
            self.uids: list[int] = []

        def _step(self) -> None:
            forward()

        def prompt(self, tokens: Any) -> None:
            forward()

    class BatchGenerator:
        def __init__(self) -> None:
            self.count, self.batch = 0, Batch()

        def insert(self, prompts: Any) -> list[int]:
            uids = list(range(self.count, self.count + len(prompts)))
            self.count += len(prompts)
            self.batch.uids += uids
            return uids

        def next_generated(self) -> list[int]:
            self.batch._step()
            return []

    class Request:
        def __init__(self, rid: str, chunked: bool) -> None:
            self.request_id, self.chunked = rid, chunked

    class State:
        def __init__(self, request: Request) -> None:
            self.request = request

    class Scheduler:
        def __init__(self) -> None:
            self.waiting: list[Request] = []
            self.uid_to_request_id: dict[int, str] = {}
            self.batch_generator = BatchGenerator()

        def add_request(self, request: Request) -> None:
            self.waiting.append(request)

        def _do_external_prefill(self, request: Request, tokens: Any, cache: Any) -> None:
            forward()
            forward()  # a second prefill_step_size chunk

        def _step_prefill_chunk(self, state: State) -> bool:
            forward()
            return True

        def step(self) -> None:
            for r in self.waiting:
                if r.chunked:
                    self._step_prefill_chunk(State(r))
                else:
                    self._do_external_prefill(r, [1, 2, 3], None)
                (uid,) = self.batch_generator.insert([[3]])
                self.uid_to_request_id[uid] = r.request_id
            self.waiting = []
            self.batch_generator.next_generated()

    class EngineCore:
        def __init__(self, scheduler: Scheduler) -> None:
            self.scheduler, self.n = scheduler, 0

        async def add_request(self, prompt: Any, request_id: str | None = None) -> str:
            self.n += 1
            rid = request_id or f"uuid-{self.n}"
            self.scheduler.add_request(Request(rid, chunked=prompt == "long"))
            return rid

    class App:
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await receive(scope)

    gen = module("mlx_lm.generate", PromptProcessingBatch=Batch, GenerationBatch=Batch)
    gen.BatchGenerator = BatchGenerator  # type: ignore[attr-defined]
    return {
        "mlx_lm.generate": gen,
        "omlx.scheduler": module("omlx.scheduler", Scheduler=Scheduler),
        "omlx.engine_core": module("omlx.engine_core", EngineCore=EngineCore),
        "omlx.server": module("omlx.server"),
        "fastapi.applications": module("fastapi.applications", FastAPI=App),
    }


class Sink:
    def __init__(self) -> None:
        self.admitted: list[tuple[str, str]] = []

    def admit(self, label: str, reply_id: str, scheduler: str) -> None:
        self.admitted.append((label, reply_id))


def serve(
    monkeypatch: pytest.MonkeyPatch, families: Any
) -> tuple[Sink, list[str], list[list[str] | None], list[str]]:
    """Three exchanges (two with the header, one long prompt prefilled in chunks, one
    without the header) admitted, then one scheduler step: what was admitted, patched and
    seen, and the engine's request ids."""
    seen: list[list[str] | None] = []
    mods = stand_ins(seen)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # install adds an import hook
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    sink = Sink()
    done = identity.install(sink, families=families)
    sched = mods["omlx.scheduler"].Scheduler()
    core = mods["omlx.engine_core"].EngineCore(sched)
    app = mods["fastapi.applications"].FastAPI()
    rids: list[str] = []

    def exchange(value: str | None, prompt: str) -> None:
        async def endpoint(_: Any) -> None:
            rids.append(await core.add_request(prompt))

        asyncio.run(app(scope(value), endpoint, None))

    exchange("hdr-a", "short")
    exchange("hdr-b", "long")
    exchange(None, "short")
    sched.step()
    return sink, done, seen, rids


def test_a_requests_prefill_and_batch_rows_carry_its_id_admitted_under_its_header(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    families = (*identity.FAMILIES, identity_vlm.FAMILY, identity_omlx.FAMILY)
    sink, done, seen, rids = serve(monkeypatch, families)
    assert {
        "omlx.scheduler:Scheduler.step",
        "omlx.scheduler:Scheduler._do_external_prefill",
        "omlx.scheduler:Scheduler._step_prefill_chunk",
        "omlx.engine_core:EngineCore.add_request",
        "fastapi.applications:FastAPI.__call__",
    } <= set(done)
    a, b, c = (label(r) for r in rids)
    assert a == f"{PID}:omlx:uuid-1"
    # a's two prefill calls, b's chunk, c's two calls, then the batch's first step, by uid
    assert seen == [[a], [a], [b], [c], [c], [a, b, c]]
    assert sink.admitted == [(a, "hdr-a"), (b, "hdr-b")]  # c came without the header
    assert identity.current_labels() is None


def test_without_the_omlx_hooks_the_prefill_is_unlabelled_and_the_rows_are_uids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the negative control: mlx-lm's hooks alone label the batch rows by uid, which no
    # admission names, and leave oMLX's external prefill to the ledger's inference
    sink, done, seen, _ = serve(monkeypatch, (*identity.FAMILIES, identity_vlm.FAMILY))
    assert not any(d.startswith("omlx.") for d in done)
    assert seen[:5] == [None] * 5
    assert seen[5] is not None and all(":omlx:" not in s for s in seen[5])
    assert sink.admitted == []


def omlx_wave(labels: tuple[str | None, str | None]) -> list[Any]:
    """Two identical prompts prefilled alone (5 of 6 tokens, oMLX's external prefill), then
    their last tokens in one batch: first tokens 3 (request x) and 4 (request y)."""
    x, y = labels
    return [
        ("px", [row(0, 5, SAME[:5], 7, x)]),
        ("py", [row(0, 5, SAME[:5], 7, y)]),
        ("g", [row(5, 6, SAME[5:], 3, x), row(5, 6, SAME[5:], 4, y, shift=0.01)]),
    ]


def test_the_ledger_follows_a_request_from_its_prefill_into_the_batch(tmp_path: Path) -> None:
    x, y = "1:omlx:x", "1:omlx:y"
    led = ledger(tmp_path, [("hdr-x", x), ("hdr-y", y), *omlx_wave((x, y))])
    got_y, _ = apply_tap(led, reply(), 1, 1, wait=0, reply_id=("hdr-y", "chatcmpl-1"))
    got_x, _ = apply_tap(led, reply(), 1, 1, wait=0, reply_id=("hdr-x", "chatcmpl-2"))
    assert (got_y.tokens, got_y.attribution) == ((4,), "id")
    assert (got_x.tokens, got_x.attribution) == ((3,), "id")
    assert led.received == 2  # one prefill per reply
    # the negative control: the batch rows labelled by uid (the step hook removed) start new
    # tracks: four prefills counted for two replies
    (tmp_path / "uids").mkdir()
    waves = omlx_wave((None, None))
    waves[2] = ("g", [row(5, 6, SAME[5:], 3, "1:1:0"), row(5, 6, SAME[5:], 4, "1:1:1")])
    unnamed = ledger(tmp_path / "uids", waves)
    unnamed.refresh()
    assert unnamed.received == 4


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("OMLX_DIR"), reason="needs oMLX's venv (OMLX_DIR; engines/omlx/install.sh)"
)
def test_omlx_waves_are_attributed_by_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """flyto-mlx 0.7.0 under the tap, 4 requests at once (identical prompts among them): every
    reply's rows by id, and one prefill per reply."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    from test_adapters_waves import WAVES

    from pytest_prefixcache import Verifier
    from pytest_prefixcache.adapters.omlx import omlx_server
    from pytest_prefixcache.checks.coverage import ATTRIBUTION

    engine = omlx_server(flags=["--block-size", "32"], audit=False, claims=False, concurrency=4)
    try:
        verifier = Verifier(engine)
        steps = verifier.run_waves(WAVES)
        assert {s.cached.attribution for s in steps} == {"id"}
        assert verifier.report.coverage[ATTRIBUTION] == {"applied": len(steps)}
        assert engine.request_count_problems() == []
    finally:
        engine.close()
