"""engines/omlx/findings.py on a made-up run: one row per combination in the matrix file's
order, the API's against the tap's reuse, and each failure's stream saved once under a name
and description the third-party corpus test accepts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from pytest_prefixcache import Message, Request
from pytest_prefixcache.output.streams import load_stream, save_stream

HERE = Path(__file__).resolve().parent
MATRIX = HERE / "matrix.toml"


def findings() -> ModuleType:
    spec = importlib.util.spec_from_file_location("omlx_findings", HERE / "findings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config(name: str, failures: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name, "verdict": "fail" if failures else "partial"}
    row["requests"] = 10
    row.update(cache_hits=4, block_size=32, block_reused=64, block_tokens=64)
    row.update(reused_tokens=64, oracle_tokens=80, worst_diff=0.25 if failures else 0.0)
    row.update(failures=failures, findings={"render hygiene": 2}, engine_error="")
    row["failures_by_check"] = {"equivalence": len(failures)} if failures else {}
    return {**row, **extra}


def test_table_and_save(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stream = [Request((Message("user", ("hello there",)),))]
    failing = save_stream(stream, run / "b" / ".prefixcache" / "failures" / "abc")
    failure: dict[str, Any] = {"check": "equivalence", "summary": "equivalence: logits differ"}
    failure.update(stream_dir=str(failing.parent), test="suite::test_corpus[agent_loop-omlx-x]")
    rows = {
        "b": config("omlx-qwen2-vl[ssd,b32]", [failure, dict(failure, test="suite::streams")]),
        "a": config("omlx-llama[ssd,shipped]", []),
    }
    for folder, row in rows.items():
        (run / folder).mkdir(parents=True, exist_ok=True)
        (run / folder / "suite.json").write_text(json.dumps({"configs": [row]}))
    (run / "tap").mkdir()
    tap = [{"use_cache": True, "prompt_tokens": 80, "api_cached_tokens": 64,
            "tap_reused_tokens": 64}, {"use_cache": False, "prompt_tokens": 80,
            "api_cached_tokens": 0, "tap_reused_tokens": 0}]  # fmt: skip
    (run / "tap" / "omlx-tiny-qwen2-vl--block-size--32.jsonl").write_text(
        "\n".join(json.dumps(r) for r in tap)
    )
    f = findings()
    lines = f.table(run, MATRIX, "flyto-mlx 0.7.0").splitlines()
    assert lines[0] == "oMLX (flyto-mlx 0.7.0), 2 combinations, seed 1"
    llama, vl = lines[-2:]  # the matrix file's order: llama first
    assert llama.startswith("| `omlx-llama[ssd,shipped]` | `no flags` | PARTIAL | 10 (4) |")
    assert "| 64 / 64 |" in vl and "blocks of 32: 100.0% (64 of 64)" in vl
    assert "equivalence: 2: streams, test_corpus (agent_loop)" in vl
    saved = f.save(run, MATRIX, tmp_path / "corpus")
    assert saved == ["omlx-qwen2-vl-ssd-b32-equivalence"]  # two failures, one stream
    back, meta = load_stream(tmp_path / "corpus" / saved[0])
    assert back == tuple(stream)
    assert meta["description"].startswith("omlx 0.7.0 (flyto-mlx 0.7.0")
    assert (meta["engine"], meta["version"], meta["mode"]) == ("omlx", "0.7.0", "qwen2-vl,ssd,b32")
