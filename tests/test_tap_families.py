"""The tap on the hybrid and sliding-window families: every default target imports, a hybrid's
KV offset is read from the first layer that has one (layer 0 is a recurrent state), a wrapped
ring reports every position seen, a wrapper calling a wrapped class records once, and a request
with no matching record says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pytest_prefixcache.tap import TapRecord, missing_reason

PROBE = Path(__file__).with_name("tap_families_probe.py")


def probe(tmp_path: Path, *targets: str) -> dict:
    pytest.importorskip("mlx_lm")
    env = {**os.environ, "PREFIXCACHE_TAP": str(tmp_path / "tap.jsonl"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(PROBE), *([",".join(targets)] if targets else [])],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_default_targets_all_import_and_record_the_prompt_offset(tmp_path: Path) -> None:
    out = probe(tmp_path)
    assert out["missing"] == [], "default targets that do not import in mlx-lm / mlx-vlm"
    assert out["installed"] == out["wrapped"]
    # one record per forward call, offsets after the call: 7 prompt positions, then a step
    assert out["calls"]["qwen3_5"] == [
        ["mlx_lm.models.qwen3_5.TextModel", 7, 7],
        ["mlx_lm.models.qwen3_5.TextModel", 1, 8],
    ]
    # the window (4) wrapped: the offset still counts every position seen
    assert out["calls"]["gemma3_text"] == [
        ["mlx_lm.models.gemma3_text.Model", 7, 7],
        ["mlx_lm.models.gemma3_text.Model", 1, 8],
    ]


@pytest.mark.slow
def test_a_wrapper_and_the_class_it_calls_record_once(tmp_path: Path) -> None:
    out = probe(tmp_path, "mlx_lm.models.qwen3_5:Model", "mlx_lm.models.qwen3_5:TextModel")
    assert [c[0] for c in out["calls"]["qwen3_5"]] == ["mlx_lm.models.qwen3_5.Model"] * 2
    assert out["calls"]["gemma3_text"] == []  # not wrapped


def test_offset_skips_layers_without_one() -> None:
    pytest.importorskip("mlx_lm")
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, KVCache

    from pytest_prefixcache.tap.wrap import _offset

    kv = KVCache()
    kv.update_and_fetch(mx.zeros((1, 2, 5, 8)), mx.zeros((1, 2, 5, 8)))
    assert _offset([ArraysCache(2), ArraysCache(2), kv], 5) == 5
    assert _offset([ArraysCache(2)], 5) == -1  # negative control: nothing to read
    assert _offset([], 3) == 3


def rec(cls: str, n: int, offset: int) -> TapRecord:
    return TapRecord(0, cls, n, 1, offset, np.zeros(2, dtype=np.float32))


def test_missing_record_reasons_name_the_cause_and_the_setting() -> None:
    why = missing_reason([], 40, None)
    assert "python -m pytest_prefixcache.tap" in why and "PREFIXCACHE_TAP" in why
    why = missing_reason([], 40, ["mlx_lm.models.llama:Model"])
    assert "no forward call" in why and "mlx_lm.models.llama:Model" in why
    assert "PREFIXCACHE_TAP_TARGETS" in why
    why = missing_reason([rec("m.Model", 40, -1)], 40, ["m:Model"])
    assert "no KV offset" in why and "m.Model" in why
    why = missing_reason([rec("m.Model", 30, 30), rec("m.Model", 1, 31)], 40, ["m:Model"])
    assert "30, 31" in why and "40" in why and "PREFIXCACHE_TAP_TARGETS" in why


def test_launcher_refuses_a_malformed_target_list(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "HF_HUB_OFFLINE": "1",
        "PREFIXCACHE_TAP": str(tmp_path / "t.jsonl"),
        "PREFIXCACHE_TAP_TARGETS": "mlx_lm.models.llama.Model",
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest_prefixcache.tap", "json:dumps"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "PREFIXCACHE_TAP_TARGETS" in done.stderr and "'mlx_lm.models.llama.Model'" in done.stderr
