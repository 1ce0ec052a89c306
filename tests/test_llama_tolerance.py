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

from pytest_prefixcache.adapters.http.server import ServerProcess
from pytest_prefixcache.adapters.llama_tolerance import (
    LLAMA_ATOL,
    MARGIN,
    ONE_ROW,
    llama_atol,
    rule_problems,
)
from pytest_prefixcache.adapters.presets import llama_server
from pytest_prefixcache.errors import EngineError

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "llama_tolerance_rules.json"
STUB = Path(__file__).resolve().parent / "stub_openai.py"


@pytest.fixture(scope="module")
def measured() -> dict[str, Any]:
    return dict(json.loads(RESULTS.read_text(encoding="utf-8")))


def test_every_family_rule_holds_against_its_measurements(measured: dict[str, Any]) -> None:
    problems = rule_problems(LLAMA_ATOL, measured["split"], measured["suite"])
    # Gemma 4 with flash attention at the default micro-batch: noise (0.50) above the smallest
    # bug (0.137), no rule fits: the preset judges it with -ub 1 ("ub1") instead
    assert problems and all(p.startswith("gemma4 on: atol 0.02 is within") for p in problems)
    assert {p.split(" ")[0] for p in problems} == set(ONE_ROW)
    families = {(r["family"], r["mode"]) for r in measured["split"]}
    rules = {key for key in LLAMA_ATOL if key[0] != "*"}
    assert rules <= families  # each rule has its measurement


def test_with_one_row_micro_batches_gemma4_with_flash_attention_is_exact(
    measured: dict[str, Any],
) -> None:
    """-ub 1 and --swa-full on both servers: split prompts and decode-time KV agree exactly
    where the default micro-batch differs by more than the smallest one-token bug (the old
    rule's FAIL on a correct server); the one-token bug still moves the logits far above the
    "ub1" rule. With the sliding-window cache -ub 1 is not enough: its noise stays within
    MARGIN of the smallest bug on both sides, so no rule fits (the preset refuses it)."""
    rows = [r for r in measured["split"] if r["family"] == "gemma4" and r["kv"] == "f16"]
    one_row = [r for r in rows if r["mode"] == "ub1"]
    default = [r for r in rows if r["mode"] == "on" and r["flags"] == ""]
    assert one_row and default and sum(r["trials"] for r in one_row) >= 100
    assert all(r["worst_cold_vs_warm"] == r["worst_decoded_reply"] == 0.0 for r in one_row)
    assert max(r["worst_decoded_reply"] for r in default) > LLAMA_ATOL["*", "on"] * 10
    assert not rule_problems(LLAMA_ATOL, one_row)
    bug = min(r["smallest_one_token_bug"] for r in one_row)
    assert bug > 1000 * llama_atol("gemma4", "ub1")
    (window,) = [r for r in rows if r["mode"] == "ub1-window"]
    assert window["worst_decoded_reply"] * MARGIN**2 > window["smallest_one_token_bug"]


@pytest.mark.parametrize(
    "atol, problem",
    [
        (0.2, "would hide a one-token cache bug"),  # above the smallest bug with -ub 1
        (2e-2, None),  # the "*" on rule: fine with -ub 1, failing at the default micro-batch
    ],
)
def test_negative_control_gemma4_ub1_rule(
    measured: dict[str, Any], atol: float, problem: str | None
) -> None:
    rows = [r for r in measured["split"] if r["family"] == "gemma4" and r["mode"] in ("on", "ub1")]
    rules = {**LLAMA_ATOL, ("gemma4", "ub1"): atol, ("gemma4", "on"): atol}
    problems = rule_problems(rules, rows)
    ub1 = [p for p in problems if p.startswith("gemma4 ub1:")]
    on = [p for p in problems if p.startswith("gemma4 on:")]
    assert on, "the default micro-batch must have no rule at this atol"
    if problem is None:
        assert not ub1, problems
    else:
        assert any(problem in p for p in ub1), problems


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
    "atol, problem",
    [
        (1e-4, "within 1.5x of the noise"),  # the "*" exact rule fails a correct Gemma 3
        (2.0, "would hide a one-token cache bug"),  # the smallest bug moved the logits 2.86
    ],
)
def test_negative_control_gemma3_off_rule(
    measured: dict[str, Any], atol: float, problem: str
) -> None:
    problems = rule_problems(
        {**LLAMA_ATOL, ("gemma3", "off"): atol}, measured["split"], measured["suite"]
    )
    problems = [p for p in problems if p.startswith("gemma3 off:")]
    assert problems and any(problem in p for p in problems), problems


def test_decode_time_kv_differs_by_the_one_row_product_only(measured: dict[str, Any]) -> None:
    """Flash attention off, f32 KV: a split prompt is exact and a decoded reply is not, until
    both servers prefill one row at a time (-ub 1): then decoding and prefill run the same
    products (sgemm.cpp: llamafile_sgemm declines n < 2) and the decoded reply is exact too."""
    for family in ("gemma3", "gemma4"):
        rows = [r for r in measured["split"] if r["family"] == family and r["mode"] == "off"]
        assert all(r["worst_cold_vs_warm"] == 0.0 for r in rows)
        default = [r for r in rows if r["flags"] == "-fa off"]
        assert max(r["worst_decoded_reply"] for r in default) > LLAMA_ATOL["*", "off"]
    (one_row,) = [r for r in measured["split"] if r["flags"] == "-fa off -ub 1"]
    assert one_row["family"] == "gemma3" and one_row["worst_decoded_reply"] == 0.0


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
    "arch, flags, mode, atol",
    [
        ("gemma3", ("-fa on",), "on", 0.2),
        ("gemma3", ("-fa on -ctk q4_0 -ctv q4_0",), "on", 0.2),
        ("gemma3", (), "off", 1e-2),
        ("gemma4", (), "off", 0.045),  # flash attention off, f32 KV: no -ub 1
        ("gemma4", ("-fa on --swa-full -np 1",), "ub1", 1e-4),  # -ub 1 added to both
        ("gemma4", ("-fa on -ctk q8_0 -ctv q8_0", "--swa-full -np 4"), "ub1", 1e-4),
        ("gemma4", ("-fa on --swa-full -np 1", "-ub 1"), "ub1", 1e-4),  # given: not twice
        ("llama", ("-fa on",), "on", 5e-3),
        ("mamba", ("-fa on",), "on", 2e-2),  # no measurement: the default
    ],
)
def test_the_preset_takes_the_rule_of_the_gguf_s_family(
    tmp_path: Path, arch: str, flags: tuple[str, ...], mode: str, atol: float
) -> None:
    model = _gguf(tmp_path / "m.gguf", arch)
    binary = f"{sys.executable} {STUB} --flavour llama"
    engine = llama_server(model, binary=binary, start_timeout=60, flags=flags)
    try:
        assert engine.atol == atol == llama_atol(arch, mode)
        assert f"llama-server, {arch}," in engine.tolerance_rule
        for proc in (engine.server, engine.cold_server):
            assert isinstance(proc, ServerProcess)
            ub = [w for i, w in enumerate(proc.cmd) if proc.cmd[i - 1] == "-ub"]
            assert ub == (["1"] if mode == "ub1" else []), proc.cmd
        assert ("-ub 1 on both servers" in engine.tolerance_rule) == (mode == "ub1")
    finally:
        engine.close()
    with pytest.raises(ValueError, match="mode='fast'"):
        llama_atol(arch, "fast")


@pytest.mark.parametrize(
    "flags, why",
    [
        (("-fa on -np 1",), "the sliding-window cache"),
        (("-fa on --swa-full -np 1 -ub 512",), "-ub 512"),
        (("-fa on --swa-full",), "several slots in one unified KV buffer"),  # -np auto
        (("-fa on --swa-full -np 2 -kvu",), "several slots in one unified KV buffer"),
    ],
)
def test_gemma4_where_no_rule_fits_is_refused(
    tmp_path: Path, flags: tuple[str, ...], why: str
) -> None:
    """No rule fits there: the preset says so before starting a server, unless atol is given
    (then it adds nothing: the caller's rule, the caller's flags)."""
    model = _gguf(tmp_path / "m.gguf", "gemma4")
    binary = f"{sys.executable} {STUB} --flavour llama"
    with pytest.raises(EngineError, match=rf"gemma4 with flash attention.*{why}.*pass atol"):
        llama_server(model, binary=binary, start_timeout=60, flags=flags)
    engine = llama_server(model, binary=binary, start_timeout=60, flags=flags, atol=0.3)
    try:
        assert isinstance(engine.server, ServerProcess) and engine.atol == 0.3
        assert engine.server.cmd.count("-ub") == flags[0].count("-ub")
    finally:
        engine.close()
