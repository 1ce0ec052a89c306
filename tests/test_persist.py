"""The reference engine's disk tier and restarts (``reference_engine/disk.py``, ``persist.py``,
``identity.py``): bit-exact after a restart, torn files never served, writes atomic, the
budget kept, and a restart with one thing changed reusing nothing from before."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_prefixcache.types import Message, Request

SYSTEM = (
    "You are a careful visual assistant. Look at every image the user sends, describe what "
    "you see precisely, answer questions about colours, shapes, text and layout."
)


def _request(text: str = "hello there", namespace: str = "") -> Request:
    return Request((Message("system", (SYSTEM,)), Message("user", (text,))), namespace, 1)


@pytest.fixture
def engine(model: Any, tmp_path: Path) -> Any:
    from reference_engine import Engine

    return Engine(model, cache_dir=tmp_path / "kv")


def test_restart_restores_bit_exact(engine: Any) -> None:
    first = engine.run(_request())
    assert first.cached_tokens == 0 and engine.disk.stats.writes > 0
    engine.restart()
    assert len(engine.pool) == 0  # a new instance: nothing in memory
    warm = engine.run(_request())
    cold = engine.run(_request(), use_cache=False)
    assert warm.cached_tokens == warm.prompt_tokens - 1  # all but the token computed
    assert engine.stats.disk_restored > 0
    assert np.array_equal(warm.logits, cold.logits)
    assert warm.tokens == cold.tokens


def test_new_instance_over_the_same_directory_restores(model: Any, tmp_path: Path) -> None:
    from reference_engine import Engine

    Engine(model, cache_dir=tmp_path).run(_request())
    again = Engine(model, cache_dir=tmp_path)
    out = again.run(_request("hello there, and more"))
    assert out.cached_tokens > 0 and again.stats.disk_restored > 0
    # negative control: another directory restores nothing
    other = Engine(model, cache_dir=tmp_path / "other")
    assert other.run(_request("hello there, and more")).cached_tokens == 0


def test_torn_and_truncated_files_are_never_served(engine: Any) -> None:
    engine.run(_request())
    files = sorted(engine.disk.directory.glob("*.kv"))
    assert files
    data = files[0].read_bytes()
    for f in files:  # one truncated, the others with a bit flipped in the payload
        raw = f.read_bytes()
        f.write_bytes(raw[: len(raw) // 2] if f == files[0] else raw[:-1] + bytes([raw[-1] ^ 1]))
    engine.restart()
    warm = engine.run(_request())
    cold = engine.run(_request(), use_cache=False)
    assert warm.cached_tokens == 0  # every chain starts at a torn block: nothing restored
    assert engine.stats.disk_torn >= 1 and engine.stats.disk_restored == 0
    assert np.array_equal(warm.logits, cold.logits)
    # the control: the intact bytes decode
    from reference_engine.disk import decode

    assert decode(data) is not None and decode(data[:-1]) is None


def test_writes_are_atomic(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from reference_engine.blocks import block_keys

    key = block_keys([1, 2, 3], [], block_size=16, root=b"r" * 32)[0]
    import mlx.core as mx

    rows = [(mx.zeros((1, 2, 3, 4)), mx.ones((1, 2, 3, 4)))]

    def crash(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        engine.disk.put(key, rows)
    assert list(engine.disk.directory.iterdir()) == []  # no file, no temp left behind
    monkeypatch.undo()
    assert engine.disk.put(key, rows)
    got = engine.disk.get(key)
    assert got is not None and bool(mx.array_equal(got[0][1], rows[0][1]))
    assert [p.suffix for p in engine.disk.directory.iterdir()] == [".kv"]


def test_budget_evicts_least_recently_used(model: Any, tmp_path: Path) -> None:
    from reference_engine import Engine

    small = Engine(model, cache_dir=tmp_path, disk_bytes=40_000)
    small.run(_request("one"))
    small.run(_request("two two two two two two two two two two two two two two two two"))
    total = sum(f.stat().st_size for f in tmp_path.glob("*.kv"))
    assert 0 < total <= 40_000 and small.disk.stats.evictions > 0
    assert small.disk.stats.bytes == total


def test_reset_clears_the_disk(engine: Any) -> None:
    engine.run(_request())
    engine.reset()
    assert not list(engine.disk.directory.glob("*.kv"))
    engine.restart()
    assert engine.run(_request()).cached_tokens == 0


@pytest.mark.parametrize("changed", ["weights", "template", "kv_dtype"])
def test_restart_with_one_thing_changed_reuses_nothing(engine: Any, changed: str) -> None:
    before = engine.identity
    engine.run(_request())
    engine.restart()
    assert engine.run(_request()).cached_tokens > 0  # the control: same identity restores
    engine.restart(changed)
    field = {"weights": "model", "template": "tokenizer", "kv_dtype": "kv_dtype"}[changed]
    assert engine.identity.changed(before) == [field]
    warm = engine.run(_request())
    cold = engine.run(_request(), use_cache=False)
    assert warm.cached_tokens == 0 and engine.stats.disk_restored == 0
    assert np.array_equal(warm.logits, cold.logits)
    again = engine.run(_request())  # and it caches under its own identity
    assert again.cached_tokens > 0


def test_bad_input_names_it(engine: Any, tmp_path: Path) -> None:
    from reference_engine.disk import DiskTier

    with pytest.raises(ValueError, match=r"restart.changed='bogus'.*weights"):
        engine.restart("bogus")
    with pytest.raises(ValueError, match="max_bytes must be a positive int, got 0"):
        DiskTier(tmp_path, 0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"disk cache directory .*file"):
        DiskTier(tmp_path / "file")


def test_restored_reuse_equals_the_reuse_without_restart(model: Any, tmp_path: Path) -> None:
    """Partial blocks too: the chain's stored siblings come back for a partial match."""
    from reference_engine import Engine

    first, then = _request("hello there"), _request("hello there, friend, and more words")
    stayed = Engine(model)
    stayed.run(first)
    want = stayed.run(then).cached_tokens
    restarted = Engine(model, cache_dir=tmp_path)
    restarted.run(first)
    restarted.restart()
    got = restarted.run(then)
    assert got.cached_tokens == want and want % 16 != 0  # a partial block's rows reused
    assert np.array_equal(got.logits, restarted.run(then, use_cache=False).logits)


def test_each_change_changes_one_thing_and_reset_goes_back(engine: Any) -> None:
    """Changes stack: each restart changes exactly one field of the identity running then
    (a template change keeps a changed KV dtype); ``reset`` returns to the first model."""
    origin = engine.model
    seen = [engine.identity]
    for changed, field in (("kv_dtype", "kv_dtype"), ("template", "tokenizer"),
                           ("template", "tokenizer"), ("weights", "model")):  # fmt: skip
        engine.restart(changed)
        assert engine.identity.changed(seen[-1]) == [field], changed
        assert engine.identity not in seen  # never an identity seen before
        seen.append(engine.identity)
    engine.run(_request())
    engine.reset()
    assert engine.model is origin and engine.identity == seen[0]
    assert not list(engine.disk.directory.glob("*.kv"))


def test_server_flags_name_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from reference_engine.server import main

    (tmp_path / "file").write_text("x")
    for argv, says in (
        (["--disk-bytes", "0"], "--disk-bytes must be a positive number of bytes, got 0"),
        (["--cache-dir", str(tmp_path / "file")], "disk cache directory"),
    ):
        with pytest.raises(SystemExit) as info:
            main(["--port", "0", *argv])
        assert info.value.code == 2 and says in capsys.readouterr().err
