"""llama-server's tolerance rules per model family (adapters/llama_tolerance.py) against the
measurements they come from (benchmarks/results/llama_tolerance_rules.json): each rule sits
between the noise measured on its family and the smallest one-token cache bug; the old single
rule fails that check (the negative controls); the preset picks the rule from the GGUF."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_prefixcache.adapters.llama_tolerance import LLAMA_ATOL, llama_atol, rule_problems
from pytest_prefixcache.adapters.presets import llama_server

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "llama_tolerance_rules.json"
STUB = Path(__file__).resolve().parent / "stub_openai.py"


@pytest.fixture(scope="module")
def measured() -> dict[str, Any]:
    return dict(json.loads(RESULTS.read_text(encoding="utf-8")))


def test_every_family_rule_holds_against_its_measurements(measured: dict[str, Any]) -> None:
    problems = rule_problems(LLAMA_ATOL, measured["split"], measured["suite"])
    # Gemma 4 with flash attention: noise (0.50) above the smallest bug (0.137), no rule fits
    assert problems and all(p.startswith("gemma4 on: atol 0.02 is within") for p in problems)
    families = {r["family"] for r in measured["split"]}
    assert {"llama", "gemma3", "qwen2vl", "gemma4"} <= families  # each rule has its measurement


@pytest.mark.parametrize(
    "atol, problem",
    [
        (1e-4, "within 1.5x of the noise"),  # the old exact rule fails a correct Gemma 4
        (0.1, "would hide a one-token cache bug"),  # above the smallest bug, 0.085
    ],
)
def test_negative_control_gemma4_off_rule(
    measured: dict[str, Any], atol: float, problem: str
) -> None:
    rows = [r for r in measured["split"] if r["family"] == "gemma4" and r["mode"] == "off"]
    problems = rule_problems({**LLAMA_ATOL, ("gemma4", "off"): atol}, rows)
    assert problems and any(problem in p for p in problems), problems


@pytest.mark.parametrize(
    "family, atol, problem",
    [
        ("llama", 2e-2, "would hide a one-token cache bug"),  # the old single "on" rule
        ("gemma3", 2e-2, "within 1.5x of the noise"),  # the old rule fails a correct server
        ("gemma3", 5.0, "would hide a one-token cache bug"),
        ("qwen2vl", 2e-3, "within 1.5x of the noise"),
    ],
)
def test_negative_control_a_rule_too_loose_or_too_tight_is_named(
    measured: dict[str, Any], family: str, atol: float, problem: str
) -> None:
    rules = {**LLAMA_ATOL, (family, "on"): atol}
    problems = rule_problems(rules, measured["split"], measured["suite"])
    problems = [p for p in problems if not p.startswith("gemma4 on:")]  # no rule fits there
    assert problems and all(p.startswith(f"{family} on: atol {atol:g}") for p in problems)
    assert any(problem in p for p in problems), problems


def test_the_split_difference_is_the_flash_attention_kernel_switch(
    measured: dict[str, Any],
) -> None:
    """With micro-batches under 64 rows on both servers (-ub 32) no prefill takes the tiled
    kernel, and a split prompt is exact where the default micro-batch is not."""
    rows = {(r["family"], r["flags"], r["kv"]): r for r in measured["split"]}
    for family in ("llama", "gemma3"):
        assert rows[family, "", "f16"]["worst_cold_vs_warm"] > 1e-3
        assert rows[family, "-ub 32", "f16"]["worst_cold_vs_warm"] == 0.0
    assert rows["gemma3", "", "q4_0"]["worst_cold_vs_warm"] == 0.0  # always the one-row kernel


def _gguf(path: Path, arch: str) -> Path:
    key, value = b"general.architecture", arch.encode()
    pair = struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, len(value)) + value
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + pair)
    return path


@pytest.mark.parametrize(
    "arch, flags, atol",
    [
        ("gemma3", ("-fa on",), 0.2),
        ("gemma3", ("-fa on -ctk q4_0 -ctv q4_0",), 0.2),
        ("gemma3", (), 1e-4),
        ("gemma4", (), 0.045),  # flash attention off, f32 KV: the exact rule
        ("llama", ("-fa on",), 5e-3),
        ("mamba", ("-fa on",), 2e-2),  # no measurement: the default
    ],
)
def test_the_preset_takes_the_rule_of_the_gguf_s_family(
    tmp_path: Path, arch: str, flags: tuple[str, ...], atol: float
) -> None:
    model = _gguf(tmp_path / "m.gguf", arch)
    binary = f"{sys.executable} {STUB} --flavour llama"
    engine = llama_server(model, binary=binary, start_timeout=60, flags=flags)
    try:
        assert engine.atol == atol == llama_atol(arch, "off" if not flags else "on")
        assert f"llama-server, {arch}," in engine.tolerance_rule
    finally:
        engine.close()
    with pytest.raises(ValueError, match="mode='fast'"):
        llama_atol(arch, "fast")
