"""The vllm_server preset's LoRA adapters and ExampleConnector store (#34,
pytest_prefixcache/adapters/vllm_identity.py), against the vLLM stub (tests/stub_openai.py,
which ignores vLLM's other arguments and logs its command lines): what each server is started
with, the adapters trait, the restart declaration, and a store that a reset empties and a
restart keeps. CI has no vLLM; the real runs are engines/vllm/run.sh's (NOTES.md)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from adapter_support import SYSTEM, req, user

from pytest_prefixcache import EngineError, Request
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.presets import vllm_server
from pytest_prefixcache.adapters.vllm import vllm_matrix_engine
from pytest_prefixcache.adapters.vllm_identity import (
    FIXTURE_ADAPTER,
    StoredVllm,
    connector_flags,
    lora_flags,
)
from pytest_prefixcache.traits import traits_of
from pytest_prefixcache.verify.restarts import declares_restart

STUB = Path(__file__).resolve().parent / "stub_openai.py"
TEXT = req(SYSTEM, user("Hello there, how are you today? Tell me about cats. " * 3))


def model_dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"vocab_size": 264}))
    return root


def preset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: object) -> OpenAIEngine:
    monkeypatch.setenv("STUB_ARGV_LOG", str(tmp_path / "argv.jsonl"))
    python = f"{sys.executable} {STUB} --flavour vllm"
    return vllm_server(model_dir(tmp_path / "m"), python=python, start_timeout=60, **kw)  # type: ignore[arg-type]


def started(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "argv.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIEngine]:
    engine = preset(tmp_path, monkeypatch, kv_store=True, audit=False)
    yield engine
    engine.close()


def test_lora_flags_load_every_adapter_at_once() -> None:
    words = lora_flags({"a": FIXTURE_ADAPTER, "b": FIXTURE_ADAPTER})
    i = words.index("--lora-modules")
    assert words[0] == "--enable-lora"
    assert words[i + 1 : i + 3] == [f"a={FIXTURE_ADAPTER}", f"b={FIXTURE_ADAPTER}"]
    assert words[words.index("--max-loras") + 1] == "2"
    assert words[words.index("--max-cpu-loras") + 1] == "2"


@pytest.mark.parametrize(
    ("modules", "says"),
    [
        ({}, "lora_modules is empty"),
        ({"a=b": FIXTURE_ADAPTER}, "must be a non-empty word"),
        ({"": FIXTURE_ADAPTER}, "must be a non-empty word"),
        ({"x": FIXTURE_ADAPTER.parent.parent}, "lora_modules['x']"),
    ],
)
def test_bad_lora_modules_are_named(modules: dict[str, Path], says: str) -> None:
    with pytest.raises(EngineError) as info:
        lora_flags(modules)
    assert says in str(info.value)


def test_adapters_are_served_and_declared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with preset(tmp_path, monkeypatch, lora_modules={"tiny-lora": FIXTURE_ADAPTER}) as e:
        assert tuple(traits_of(e).adapters) == ("tiny-lora",)
        e.run(Request(TEXT.messages, adapter="tiny-lora"), use_cache=True)
        with pytest.raises(EngineError, match="cannot be sent"):
            e.run(Request(TEXT.messages, adapter="other"), use_cache=True)
    (cmd,) = started(tmp_path)
    assert cmd[cmd.index("--lora-modules") + 1] == f"tiny-lora={FIXTURE_ADAPTER}"
    assert not declares_restart(e)  # no store: the restart streams skip it
    # the control: a preset without adapters declares none and sends none
    with preset(tmp_path / "plain", monkeypatch) as plain:
        assert tuple(traits_of(plain).adapters) == ()
        with pytest.raises(EngineError, match="cannot be sent"):
            plain.run(Request(TEXT.messages, adapter="tiny-lora"), use_cache=True)


def test_the_store_is_on_the_cached_server_only(tmp_path: Path, stored: OpenAIEngine) -> None:
    assert isinstance(stored, StoredVllm) and declares_restart(stored)
    assert stored.baseline.cold == "reset"
    stored.run(TEXT, use_cache=True)
    stored.run(TEXT, use_cache=False)
    cmds = started(tmp_path)
    with_store = [c for c in cmds if connector_flags(stored.store)[-1] in c]
    assert len(cmds) == 2 and len(with_store) == 1, cmds  # the cold server has no connector
    assert all(w in with_store[0] for w in connector_flags(stored.store))


def test_a_reset_empties_the_store_and_a_restart_keeps_it(stored: OpenAIEngine) -> None:
    assert isinstance(stored, StoredVllm)
    stored.run(TEXT, use_cache=True)
    (stored.store / "abc").mkdir()
    (stored.store / "abc" / "layer.safetensors").write_bytes(b"kv")
    stored.restart()
    assert (stored.store / "abc" / "layer.safetensors").read_bytes() == b"kv"
    assert stored.run(TEXT, use_cache=True).cached_tokens == 0  # the stub's cache did not
    stored.reset()
    assert stored.store.is_dir() and list(stored.store.iterdir()) == []
    with pytest.raises(EngineError, match="nothing changed"):
        stored.restart("adapter")
    store = stored.store
    stored.close()
    assert not store.exists()


def test_a_salted_cold_run_cannot_use_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(EngineError, match="token ids only"):
        preset(tmp_path, monkeypatch, kv_store=True, cold="salt")
    assert started(tmp_path) == []


def test_the_matrix_engine_serves_the_fixture_adapter_on_text_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_MODELS", str(tmp_path))
    monkeypatch.setenv("VLLM_PYTHON", f"{sys.executable} {STUB} --flavour vllm")
    model_dir(tmp_path / "tiny-llama-hf")
    model_dir(tmp_path / "tiny-qwen2-vl-hf")
    e = vllm_matrix_engine("text", adapters=("a", "b"), kv_store=True)
    try:
        assert tuple(traits_of(e).adapters) == ("a", "b") and declares_restart(e)
    finally:
        e.close()
    with pytest.raises(EngineError, match="fits tiny-llama-hf only"):
        vllm_matrix_engine("vl", adapters=("a",))
