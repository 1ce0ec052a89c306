"""engines/seed/findings.py: a combination's row from a matrix report, and the table's claims,
per-step and other-failures columns (from saved report files; no engine)."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_prefixcache import Message, Request
from pytest_prefixcache.output.streams import load_stream, save_stream

HERE = Path(__file__).resolve().parent
CLAIM = (
    "claims: cached run: stats GET /v1/cache/stats engine_cache.mllm_cache.tokens_saved (delta) "
    "claims 67 prompt token(s) reused, but the model prefilled 82 of 82 prompt tokens"
)
STEP = (
    "claims: cached run: the API's per-step logprobs do not align with the 8 decode step(s) the "
    "model computed: step 1: shifted: it is the model's step 2"
)
MATRIX = """
[[config]]
name = "vllm-mlx"
engine = "pytest_prefixcache.adapters.seed:seed_server"
args = { engine = "vllm-mlx" }
[config.flags]
path = { text = "", mllm = "--mllm" }
"""


@pytest.fixture
def findings() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("seed_findings", HERE / "findings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("test_seed_engines", None)
    sys.modules.pop("test_seed_waves", None)


def config(name: str, failures: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    return {
        "name": name,
        "verdict": "fail" if failures else "pass",
        "requests": 20,
        "cache_hits": 4,
        "reused_tokens": 300,
        "oracle_tokens": 400,
        "efficiency": 0.75,
        "worst_diff": 0.0,
        "claims_checked": 1234,
        "steps_aligned": steps,
        "failures": failures,
    }


def test_rows_from_a_matrix_report_and_their_columns(findings: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(MATRIX)
    fail = [
        {"check": "claims", "test": "t", "summary": CLAIM, "stream_dir": None},
        {"check": "claims", "test": "t", "summary": STEP, "stream_dir": None},
        {"check": "fault", "test": "t", "summary": "fault: 503 model replacement"},
    ]
    report = {"configs": [config("vllm-mlx[text]", [], 0), config("vllm-mlx[mllm]", fail, 96)]}
    (tmp_path / "suite.json").write_text(json.dumps(report))
    (tmp_path / "tap").mkdir()
    tap = {"use_cache": True, "prompt_tokens": 80, "api_cached_tokens": None}
    (tmp_path / "tap" / "vllm-mlx--mllm.jsonl").write_text(
        json.dumps({**tap, "tap_reused_tokens": 60}) + "\n"
    )
    rows = findings.matrix_rows(tmp_path, tmp_path, tmp_path / "m.toml", {"vllm-mlx": "0.6.0"})
    assert [(r["mode"], r["flags"], r["order"]) for r in rows] == [
        ("text", "", 0),
        ("mllm", "--mllm", 1),
    ]
    assert rows[1]["tap"]["tap_reused"] == 60 and rows[0]["tap"]["requests"] == 0
    assert (tmp_path / "vllm-mlx-mllm" / "row.json").is_file()
    header, _, quiet, loud = findings.table(tmp_path).splitlines()
    assert header.count("|") == 10 and "claims disagreements | per-step misalignments" in header
    # the negative control: a clean combination says so in each column
    assert quiet.startswith("| vllm-mlx 0.6.0 | no flags | 20 (4 hits) | 75.0% (300 of 400) |")
    assert quiet.endswith(
        "| 0 | none (1,234 figures checked) | n/a: the API returned no per-step logprobs | none |"
    )
    cells = [c.strip() for c in loud.split("|")]
    assert cells[2] == "`--mllm`" and cells[5] == "not reported / 20 of 80"
    assert cells[7].startswith("claims: cached run: stats GET /v1/cache/stats engine_cache.mllm")
    assert cells[8].startswith("claims: cached run: the API's per-step logprobs do not align")
    assert cells[9] == "fault: 503 model replacement"


def test_the_seed_script_saves_each_distinct_counterexample_once_with_a_description(
    findings: ModuleType, tmp_path: Path
) -> None:
    stream = [Request((Message("user", ("describe the image",)),))]
    failures = save_stream(stream, tmp_path / "run" / ".prefixcache" / "failures" / "abc")
    summary = "reuse bound: cached_tokens=21 exceeds the maximum valid reuse of 0 tokens"
    failure = {"check": "reuse bound", "summary": summary, "stream_dir": str(failures.parent)}
    # a matrix combination's row: its labels name the counterexample, its flags describe it
    row: dict[str, Any] = {"engine": "rapid-mlx", "version": "0.16.10", "mode": "text,paged"}
    row["flags"] = "--use-paged-cache"
    row["failures"] = [dict(failure, test="streams"), dict(failure, test="state machine")]
    (tmp_path / "run" / "row.json").write_text(json.dumps(row))
    name = "rapid-mlx-text-paged-reuse-bound"
    assert findings.save(tmp_path, tmp_path / "corpus") == [name]
    saved, meta = load_stream(tmp_path / "corpus" / name)
    assert saved == tuple(stream)
    assert meta["description"].startswith("rapid-mlx 0.16.10, --use-paged-cache, found by")
    assert meta["description"].endswith(summary) and meta["check"] == "reuse bound"
    assert [
        f["saved"] for f in json.loads((tmp_path / "run" / "row.json").read_text())["failures"]
    ] == [name] * 2
