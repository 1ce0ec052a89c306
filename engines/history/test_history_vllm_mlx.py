"""The public record's vllm-mlx rows (engines/history/history_seed.py): the resets and the MLX
an old vllm-mlx runs with, the layered install's pip words (stubbed), and the corpus scenarios
its entries add (the token twins of #444: two prompts whose differing block agrees modulo 256)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import history_seed  # noqa: E402
from history_catalogue import CORPUS, load  # noqa: E402
from history_runner import companions, mlx_for  # noqa: E402
from test_history import CHECKS, stub_bug  # noqa: E402

from pytest_prefixcache.output.streams import load_stream  # noqa: E402
from pytest_prefixcache.session.matrix_file import read_matrix  # noqa: E402

PYTHON = Path("/h/vllm-mlx-0.3.0/bin/python")
BLOCK = 64  # vllm-mlx's --paged-cache-block-size default (scheduler.py, 0.2.9 and 0.3.0)


def vllm(flags: str = "", buggy: str = "0.3.0", fixed: str = "0.4.0") -> Any:
    bug = stub_bug(engine="vllm-mlx", runner="vllm-mlx", buggy=buggy, fixed=fixed)
    return replace(bug, flags=flags, concurrency=1)


def test_the_resets_of_old_vllm_mlx_series() -> None:
    assert history_seed.resets_of(vllm("--mllm"), "0.3.0") == "restart"
    assert history_seed.resets_of(vllm(""), "0.2.9") == "restart"
    batched = vllm("--continuous-batching --use-paged-cache")
    assert history_seed.resets_of(batched, "0.2.9") == "DELETE /v1/cache/prefix, DELETE /v1/cache"
    qwen2 = replace(vllm("--mllm --continuous-batching"), model="tiny-qwen2-vl")
    assert history_seed.resets_of(qwen2, "0.2.9") == history_seed.resets_of(qwen2, "0.3.0")
    assert history_seed.resets_of(qwen2, "0.3.0") == "restart"
    qwen35 = replace(qwen2, model="tiny-qwen3.5-vl")  # its stale ids are a catalogued bug
    assert history_seed.resets_of(qwen35, "0.3.0") == ""
    assert history_seed.resets_of(qwen35, "0.2.9") == "DELETE /v1/cache/prefix, DELETE /v1/cache"
    # negative controls: the adapter's own resets where they empty the caches
    assert history_seed.resets_of(batched, "0.3.0") == ""
    assert history_seed.resets_of(vllm("--mllm"), "0.4.0") == ""


def test_the_resets_reach_the_matrix(tmp_path: Path) -> None:
    for version, resets in (("0.3.0", "restart"), ("0.4.0", None)):
        (tmp_path / "matrix.toml").write_text(
            history_seed.matrix_text(vllm("--mllm"), version, PYTHON)
        )
        (target,) = read_matrix(tmp_path / "matrix.toml")
        assert target.args.get("resets") == resets
        assert target.flags == ("--mllm",)


def test_vllm_mlx_0_2_and_0_3_run_on_mlx_0_31_and_later_ones_on_the_seeds() -> None:
    old = {"mlx": "0.31.2", "mlx-cpu": "0.31.2"}
    assert history_seed.companions(vllm(), "0.2.9") == old
    assert companions(vllm(buggy="0.2.9", fixed="0.3.0"), "fixed") == old
    assert mlx_for(vllm(buggy="0.2.9", fixed="0.3.0"), "buggy") == "0.31.2"
    assert companions(vllm(buggy="0.4.1", fixed="0.5.0"), "buggy") == {}
    assert mlx_for(vllm(buggy="0.4.1", fixed="0.5.0"), "fixed") == "the seed environment's"
    rapid = stub_bug(engine="rapid-mlx", runner="rapid-mlx", buggy="0.12.7", fixed="0.12.8")
    assert companions(rapid, "buggy") == {}


class FakeShell:
    """``subprocess.run`` for install(): a venv is a directory, pip records its words and makes
    the packages importable, the version probe prints what pip installed."""

    def __init__(self) -> None:
        self.installed: dict[str, str] = {}
        self.pip: list[list[str]] = []

    def __call__(self, argv: Sequence[str], **_: Any) -> subprocess.CompletedProcess[str]:
        words = [str(w) for w in argv]
        if words[1:3] == ["-m", "venv"]:
            venv = Path(words[-1])
            (venv / "bin").mkdir(parents=True)
            (venv / "bin" / "python").write_text("")
            (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
        elif words[1:3] == ["-m", "pip"]:
            self.pip.append(words)
            for spec in words[words.index("--no-deps") + 1 :]:
                name, version = spec.split("==")
                self.installed[name] = version
        elif words[1] == "-c":
            names = [s.split("'")[1] for s in words[2].split("m.version(")[1:]]
            if any(n not in self.installed for n in names):
                return subprocess.CompletedProcess(argv, 1, "", "PackageNotFoundError")
            return subprocess.CompletedProcess(
                argv, 0, " ".join(self.installed[n] for n in names) + "\n", ""
            )
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_install_layers_the_wheel_and_its_mlx_and_reuses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = tmp_path / "seed" / "vllm-mlx" / "lib" / "python3.11" / "site-packages"
    seed.mkdir(parents=True)
    monkeypatch.setenv("SEED_DIR", str(tmp_path / "seed"))
    shell = FakeShell()
    monkeypatch.setattr(history_seed.subprocess, "run", shell)
    venv = tmp_path / "vllm-mlx-0.2.9"
    bug = vllm(buggy="0.2.9", fixed="0.3.0")
    python = history_seed.install(bug, "0.2.9", venv)
    assert python == venv / "bin" / "python"
    (pip,) = shell.pip
    assert pip[-3:] == ["vllm-mlx==0.2.9", "mlx==0.31.2", "mlx-cpu==0.31.2"]
    assert (venv / "lib/python3.11/site-packages/zz-seed.pth").read_text() == f"{seed}\n"
    history_seed.install(bug, "0.2.9", venv)
    assert len(shell.pip) == 1  # reused: the probe found both versions
    shell.installed["mlx"] = "0.32.4"  # the wheel alone, as made before this MLX rule
    history_seed.install(bug, "0.2.9", venv)
    assert shell.pip[-1][-3:] == ["vllm-mlx==0.2.9", "mlx==0.31.2", "mlx-cpu==0.31.2"]
    later = history_seed.install(vllm(buggy="0.4.1", fixed="0.5.0"), "0.4.1", tmp_path / "v041")
    assert later.is_file() and shell.pip[-1][-1] == "vllm-mlx==0.4.1"  # the seed's MLX


def _rendered(name: str) -> list[list[int]]:
    from pytest_prefixcache.adapters.http.render import TextRenderer

    render = TextRenderer(ROOT / "fixtures" / "tiny-llama")
    stream, _ = load_stream(CORPUS / name)
    return [render(request)[0] for request in stream]


def _low_byte_hash(block: Sequence[int]) -> str:  # vllm-mlx 0.2.9 paged_cache.py
    return hashlib.sha256(bytes(t & 0xFF for t in block)).hexdigest()[:16]


def _four_byte_hash(block: Sequence[int]) -> str:  # vllm-mlx 0.3.0 paged_cache.py
    return hashlib.sha256(b"".join(t.to_bytes(4, "big") for t in block)).hexdigest()[:16]


def test_the_token_twins_differ_in_one_full_block_that_agrees_modulo_256() -> None:
    first, second = _rendered("token_twins.json")
    assert len(first) == len(second) == 286
    (where,) = [i for i, (a, b) in enumerate(zip(first, second)) if a != b]
    assert where == 238 and (first[where] - second[where]) % 256 == 0
    block = slice(where // BLOCK * BLOCK, (where // BLOCK + 1) * BLOCK)
    assert block.stop <= len(first)  # a full block: the store hashes only those
    assert _low_byte_hash(first[block]) == _low_byte_hash(second[block])  # the bug's key
    assert _four_byte_hash(first[block]) != _four_byte_hash(second[block])  # the fix's
    # negative control: a one-token change that is not a twin is told apart by the low bytes
    other = [*second[block]]
    other[where % BLOCK] += 1
    assert _low_byte_hash(first[block]) != _low_byte_hash(other)


def test_the_vllm_mlx_entries_name_scenarios_that_load() -> None:
    entries = [b for b in load(CHECKS) if b.engine == "vllm-mlx" and b.corpus]
    assert {b.corpus for b in entries} >= {"token_twins.json", "shared_system_prompt.json"}
    for bug in entries:
        stream, _ = load_stream(CORPUS / bug.corpus)
        assert len(stream) >= 2 and bug.corpus.removesuffix(".json") in bug.select
    stream, _ = load_stream(CORPUS / "shared_system_prompt.json")
    systems = {r.messages[0].content for r in stream}
    users = {r.messages[1].content for r in stream}
    assert len(systems) == 1 and len(users) == len(stream)  # one system prompt, new questions


def _result(fixed: dict[str, Any]) -> dict[str, Any]:
    buggy = {"verdict": "FAIL", "check": "equivalence", "version": "0.2.9"}
    return {"buggy": buggy, "fixed": {"version": "0.3.0", **fixed}}


def test_a_fixed_side_partial_only_by_the_seed_runs_design_passes() -> None:
    from history_table import outcome

    bug = vllm(buggy="0.2.9", fixed="0.3.0")
    by_design = {"verdict": "PARTIAL", "not_checked": ["cold baseline"]}
    assert outcome(bug, _result(by_design)) == "caught"
    # negative controls: another gap, or no record of the gaps, is no clean fixed side
    other = {"verdict": "PARTIAL", "not_checked": ["cold baseline", "equivalence"]}
    assert outcome(bug, _result(other)) == "the fixed version is partial"
    assert outcome(bug, _result({"verdict": "PARTIAL"})) == "the fixed version is partial"


def test_a_fixed_side_that_reused_nothing_proves_nothing() -> None:
    from history_table import outcome

    bug = vllm(buggy="0.2.9", fixed="0.3.0")
    idle = {"verdict": "PASS", "cache_hits": 0}
    assert outcome(bug, _result(idle)).startswith("the fixed version's pass is vacuous")
    assert outcome(bug, _result({"verdict": "PASS", "cache_hits": 1})) == "caught"  # control


def test_parse_keeps_what_a_partial_verdict_left_unchecked() -> None:
    from history_runner import parse

    suite = {"verdict": "partial", "failures": [], "not_checked": {"cold baseline": {"x": 2}}}
    assert parse(suite, "", 0)["not_checked"] == ["cold baseline"]
    assert parse({"verdict": "pass", "failures": []}, "", 0)["not_checked"] == []


def test_vllm_mlx_before_0_2_9_starts_without_enable_metrics(tmp_path: Path) -> None:
    from pytest_prefixcache.adapters.seed import claim_specs, commands

    for version, metrics in (("0.2.8", False), ("0.2.9", None)):
        text = history_seed.matrix_text(vllm(buggy="0.2.8", fixed="0.2.9"), version, PYTHON)
        (tmp_path / "matrix.toml").write_text(text)
        (target,) = read_matrix(tmp_path / "matrix.toml")
        assert target.args.get("metrics") == metrics
    model = ROOT / "fixtures" / "tiny-llama"
    cached, cold = commands("vllm-mlx", [], "python", model, metrics=False)
    assert "--enable-metrics" not in cached + cold
    assert "--enable-metrics" in commands("vllm-mlx", [], "python", model)[0]  # the default
    assert any("metric" in spec for spec in claim_specs("vllm-mlx", []))  # what it then drops
