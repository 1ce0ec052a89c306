"""The llama_server preset's restarts (slot files) and per-request LoRA scales, against a stub
llama-server (tests/stub_llama_slots.py): what is restored equals cold, a restart with one
thing changed reuses nothing, adapters share nothing; each with its negative control (the
stub's faults)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from adapter_support import SYSTEM, req, user

from pytest_prefixcache import EngineError, Verifier
from pytest_prefixcache.adapters.http.server import ServerProcess
from pytest_prefixcache.adapters.llama_slots import LlamaServerEngine, changed_command
from pytest_prefixcache.adapters.presets import llama_server
from pytest_prefixcache.errors import (
    EngineFault,
    EquivalenceFailure,
    StaleIdentityFailure,
    VerificationFailure,
)
from pytest_prefixcache.strategies import Restart
from pytest_prefixcache.traits import traits_of
from pytest_prefixcache.verify.restarts import declares_restart, run_restart_stream
from pytest_prefixcache.verify.verifier import VerifyOptions

STUB = Path(__file__).resolve().parent / "stub_llama_slots.py"
TEXT = req(SYSTEM, user("Hello there, how are you today? Tell me a long story about cats. " * 2))
CHANGES = {
    "weights": ("-m", "tuned.gguf"),
    "kv_dtype": ("-ctk", "f16", "-ctv", "f16"),
    "adapter": ("--lora", "a.gguf"),
}


def preset(**kw: Any) -> LlamaServerEngine:
    binary = f"{sys.executable} {STUB}"
    return llama_server("tiny.gguf", binary=binary, start_timeout=60, **kw)


@pytest.fixture
def restarting(monkeypatch: pytest.MonkeyPatch) -> Iterator[LlamaServerEngine]:
    monkeypatch.setenv("PYTHONPATH", str(STUB.parent))
    engine = preset(slot_save=True, restart_flags=CHANGES)
    yield engine
    engine.close()


def verifier(engine: object, tmp_path: Path) -> Verifier:
    options = VerifyOptions(failures_dir=tmp_path / "failures", timeout=120.0)
    return Verifier(engine, options=options)  # type: ignore[arg-type]


def test_changed_command_replaces_a_flag_s_value_or_adds_it() -> None:
    cmd = ["srv", "--model", "a.gguf", "-ctk", "f32", "--lora", "x.gguf"]
    assert changed_command(cmd, ["-m", "b.gguf"]) == ["srv", "--model", "b.gguf", *cmd[3:]]
    assert changed_command(cmd, ["-ctk f16 -ctv f16"])[3:] == ["-ctk", "f16", "--lora", "x.gguf",
                                                               "-ctv", "f16"]  # fmt: skip
    assert changed_command(cmd, ["--lora", "y.gguf"])[-2:] == ["--lora", "y.gguf"]  # added
    with pytest.raises(EngineError, match="NAME VALUE pairs"):
        changed_command(cmd, ["-m"])


def test_the_preset_declares_restarts_only_with_a_slot_directory(
    restarting: LlamaServerEngine,
) -> None:
    assert declares_restart(restarting) and traits_of(restarting).restart_changes == tuple(CHANGES)
    assert restarting.slot_dir is not None and Path(restarting.slot_dir).is_dir()
    assert isinstance(restarting.server, ServerProcess)
    assert isinstance(restarting.cold_server, ServerProcess)
    assert "--slot-save-path" in restarting.server.cmd
    assert "--slot-save-path" not in restarting.cold_server.cmd  # it keeps no cache
    plain = preset()
    try:
        assert not declares_restart(plain)
        with pytest.raises(EngineError, match="slot directory"):
            plain.restart(None)
    finally:
        plain.close()
    with pytest.raises(EngineError, match="restart_flags without slot_save"):
        preset(restart_flags=CHANGES)
    with pytest.raises(EngineError, match="can change"):
        restarting.restart("template")


def test_a_restart_restores_the_slots_and_what_they_give_equals_cold(
    restarting: LlamaServerEngine, tmp_path: Path
) -> None:
    v = verifier(restarting, tmp_path)
    steps = run_restart_stream(v, (TEXT, Restart(None), TEXT))
    assert steps[1].cached.cached_tokens and steps[1].cached.cached_tokens > 0  # restored
    assert restarting.slot_counts["restored_tokens"] > 0 and restarting.slot_counts["refused"] == 0
    assert v.report.coverage["restart"] == {"applied": 1}
    # the control: without the restore, the restart leaves nothing to reuse
    restarting.reset()
    restarting.run(TEXT, use_cache=True)
    assert isinstance(restarting.server, ServerProcess)
    restarting.server.stop()
    restarting._start(restarting.server)
    assert restarting.run(TEXT, use_cache=True).cached_tokens == 0


@pytest.mark.parametrize("changed", sorted(CHANGES))
def test_a_changed_restart_reuses_nothing_and_reset_goes_back(
    restarting: LlamaServerEngine, tmp_path: Path, changed: str
) -> None:
    assert isinstance(restarting.server, ServerProcess)
    assert isinstance(restarting.cold_server, ServerProcess)
    before = (list(restarting.server.cmd), list(restarting.cold_server.cmd))
    v = verifier(restarting, tmp_path)
    steps = run_restart_stream(v, (TEXT, Restart(changed), TEXT, TEXT))
    assert steps[1].cached.cached_tokens == 0 and (steps[2].cached.cached_tokens or 0) > 0
    assert restarting.slot_counts["refused"] == 4  # the stub refuses another identity's file
    flag = CHANGES[changed][-1]
    assert flag in restarting.server.cmd and flag in restarting.cold_server.cmd  # both changed
    restarting.reset()
    assert (restarting.server.cmd, restarting.cold_server.cmd) == before


def test_negative_control_a_slot_restored_into_another_identity_is_caught(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(STUB.parent))
    monkeypatch.setenv("STUB_FAULT", "restore_any_identity")
    engine = preset(slot_save=True, restart_flags=CHANGES)
    try:
        v = verifier(engine, tmp_path)
        run_restart_stream(v, (TEXT, Restart(None), TEXT))  # the same identity: still right
        with pytest.raises(StaleIdentityFailure, match="after a restart with the adapter changed"):
            run_restart_stream(v, (TEXT, Restart("adapter"), TEXT))
    finally:
        engine.close()


def test_negative_control_restored_rows_that_differ_from_cold_fail(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(STUB.parent))
    monkeypatch.setenv("STUB_FAULT", "restore_corrupt")
    engine = preset(slot_save=True)
    try:
        with pytest.raises(EquivalenceFailure, match="restarts in this stream: before request 1"):
            run_restart_stream(verifier(engine, tmp_path), (TEXT, Restart(None), TEXT))
    finally:
        engine.close()


def test_a_refused_restore_with_nothing_changed_is_a_fault(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(STUB.parent))
    monkeypatch.setenv("STUB_FAULT", "restore_fails")
    engine = preset(slot_save=True)
    try:
        with pytest.raises(EngineFault, match=r"restoring slot 0 after a restart with nothing"):
            run_restart_stream(verifier(engine, tmp_path), (TEXT, Restart(None), TEXT))
    finally:
        engine.close()


ADAPTERS = {"lora": (1.0,), "half": (0.5,)}


def adapters_preset(monkeypatch: pytest.MonkeyPatch, fault: str = "") -> LlamaServerEngine:
    monkeypatch.setenv("PYTHONPATH", str(STUB.parent))
    monkeypatch.setenv("STUB_FAULT", fault)
    flags = ["--lora a.gguf", "--lora-init-without-apply"]
    return preset(flags=flags, adapters=ADAPTERS)


def test_a_request_s_adapter_is_its_lora_field(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = adapters_preset(monkeypatch)
    try:
        assert traits_of(engine).adapters == ("lora", "half")
        lora = req(SYSTEM, user("Hello there, " * 12)).__class__
        r = TEXT
        assert engine.request_body(r) == {}  # no adapter: the server's own scales
        with_lora = lora(r.messages, r.namespace, r.max_new_tokens, "half")
        assert engine.request_body(with_lora) == {"lora": [{"id": 0, "scale": 0.5}]}
        base, first = engine.run(r, use_cache=True), engine.run(with_lora, use_cache=True)
        assert first.cached_tokens == 0 and first.tokens != base.tokens  # another identity
        again = engine.run(with_lora, use_cache=True)
        assert (again.cached_tokens or 0) > 0 and again.tokens == first.tokens
        with pytest.raises(EngineError, match="request adapter 'other'"):
            engine.run(lora(r.messages, r.namespace, 3, "other"), use_cache=True)
    finally:
        engine.close()
    with pytest.raises(EngineError, match=r"one scale per --lora \(1\)"):
        preset(flags=["--lora a.gguf"], adapters={"x": (1.0, 1.0)})
    explicit = preset(flags=["--lora a.gguf"], adapters=ADAPTERS, base_scales=(0.0,))
    try:  # the base's own scales sent as such, not left to the server
        assert explicit.request_body(TEXT) == {"lora": [{"id": 0, "scale": 0.0}]}
    finally:
        explicit.close()


def test_adapters_share_nothing_and_the_negative_control_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stream = [TEXT, *(TEXT.__class__(TEXT.messages, "", 3, a) for a in ("lora", "half"))]
    engine = adapters_preset(monkeypatch)
    try:
        verifier(engine, tmp_path).run(stream)
    finally:
        engine.close()
    engine = adapters_preset(monkeypatch, fault="lora_not_in_key")
    try:
        with pytest.raises(VerificationFailure) as caught:
            verifier(engine, tmp_path).run(stream)
        assert "isolation" in str(caught.value) or "equivalence" in str(caught.value)
    finally:
        engine.close()
