"""The public record's runner across versions (engines/history): what an mlx-vlm version runs
on, the cache-less cold server of mlx-lm before 0.31.0, the text-only mlx-vlm preset and the
renderer's rule for mlx-vlm before its special-tokens helper; with stubs."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from history_nocache import no_prompt_cache  # noqa: E402
from history_runner import NOCACHE, command, companions, matrix_text, uses_matrix  # noqa: E402
from test_history import stub_bug  # noqa: E402

from pytest_prefixcache.session.matrix_file import read_matrix  # noqa: E402


def test_an_mlx_vlm_version_runs_on_the_mlx_and_mlx_lm_its_wheel_requires() -> None:
    vlm = stub_bug(engine="mlx-vlm", runner="mlx-vlm", buggy="0.6.7", fixed="0.6.8")
    assert companions(vlm, "buggy") == {"mlx": "0.32.4", "mlx-cpu": "0.32.4", "mlx-lm": "0.32.2"}
    assert "mlx-lm" not in companions(stub_bug(), "buggy")  # an mlx-lm row: its own MLX only
    with pytest.raises(ValueError, match=re.escape("mlx-vlm 0.5 series")):
        companions(replace(vlm, buggy="0.5.1"), "buggy")


def test_an_mlx_lm_version_before_0_31_gets_the_cache_less_cold_server(tmp_path: Path) -> None:
    old = stub_bug(buggy="0.30.2", fixed="0.31.0")
    assert uses_matrix(old, "buggy") and not uses_matrix(old, "fixed")
    (tmp_path / "matrix.toml").write_text(matrix_text(old, "buggy"))
    (target,) = read_matrix(tmp_path / "matrix.toml")  # the plugin's own parser
    assert target.args == {
        "concurrency": 8,
        "cold_module": NOCACHE,
        "body": {"logprobs": -1},
    }
    assert "cold_module" not in matrix_text(old, "fixed")  # the control: 0.31.0 has the flag
    assert (
        f"--prefixcache-matrix={tmp_path / 'matrix.toml'}"
        in command(old, "buggy", Path("p"), tmp_path).argv
    )


def test_an_mlx_vlm_entry_runs_its_preset_text_only_when_asked(tmp_path: Path) -> None:
    vlm = stub_bug(engine="mlx-vlm", runner="mlx-vlm", buggy="0.6.7", fixed="0.6.8", images=False)
    (tmp_path / "matrix.toml").write_text(matrix_text(vlm))
    (target,) = read_matrix(tmp_path / "matrix.toml")
    assert target.engine.endswith(":mlx_vlm_server") and target.args == {"images": False}
    with_images = replace(vlm, images=True)
    assert not uses_matrix(with_images)  # the control: the stock preset, no matrix
    run = command(with_images, "buggy", Path("p"), tmp_path)
    assert "--prefixcache-engine=pytest_prefixcache.adapters.presets:mlx_vlm_server" in run.argv


def test_the_cold_server_of_old_mlx_lm_finds_and_keeps_nothing() -> None:
    class Lru:  # what mlx-lm 0.30's LRUPromptCache does with an inserted prompt
        def __init__(self) -> None:
            self.kept: dict[tuple[int, ...], str] = {}

        def insert_cache(self, model: str, tokens: list[int], cache: str) -> None:
            self.kept[tuple(tokens)] = cache

        def fetch_nearest_cache(self, model: str, tokens: list[int]) -> tuple[object, list[int]]:
            return self.kept.get(tuple(tokens)), [] if tuple(tokens) in self.kept else tokens

    real = Lru()
    real.insert_cache("m", [1, 2, 3], "kv")
    assert real.fetch_nearest_cache("m", [1, 2, 3]) == ("kv", [])  # the control: a hit
    cold = no_prompt_cache(Lru)()
    cold.insert_cache("m", [1, 2, 3], "kv")
    assert cold.fetch_nearest_cache("m", [1, 2, 3]) == (None, [1, 2, 3]) and not cold.kept


def test_the_vlm_renderer_knows_the_special_tokens_rule_of_versions_before_its_helper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """mlx-vlm before 0.6.12 has no ``should_add_special_tokens``: the renderer falls back to
    the rule 0.6.7's server inlined, which agrees with the helper where both exist."""
    utils = pytest.importorskip("mlx_vlm.utils")
    from types import SimpleNamespace

    from pytest_prefixcache.adapters.http.render import _add_special_tokens

    cases = [
        (kind, SimpleNamespace(chat_template=t))
        for kind in ("gemma3", "gemma4", "qwen2_vl")
        for t in ("{{ x }}", None)
    ]
    helper = [utils.should_add_special_tokens(kind, p) for kind, p in cases]
    assert helper == [False, True, False, True, True, True]  # the control: the helper's answers
    monkeypatch.delattr(utils, "should_add_special_tokens")
    assert [_add_special_tokens(kind, p) for kind, p in cases] == helper


class _Recorder:
    """Stands in for OpenAIEngine (as in tests/test_tolerance_doors.py): keeps its arguments."""

    def __init__(self, cmd: object = None, **kwargs: object) -> None:
        self.cmd, self.kwargs = cmd, kwargs
        self.atol, self.tolerance_rule = 0.0, ""


def test_the_presets_take_what_the_runner_passes_old_versions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pytest_prefixcache.adapters import presets

    for module in (presets.reference, presets.mlx_lm, presets.mlx_vlm, presets.server):
        monkeypatch.setattr(module, "OpenAIEngine", _Recorder)
    monkeypatch.delenv("PREFIXCACHE_MODEL", raising=False)
    stock: Any = presets.mlx_lm_server(concurrency=1)
    assert stock.kwargs["cold_cmd"] == stock.cmd + " --prompt-cache-size 0"  # the control
    assert stock.kwargs["extra_body"] == {}
    old: Any = presets.mlx_lm_server(concurrency=1, cold_module=NOCACHE, body={"logprobs": -1})
    assert old.cmd == stock.cmd and old.kwargs["extra_body"] == {"logprobs": -1}
    assert old.kwargs["cold_cmd"] == stock.cmd.replace("mlx_lm.server:main", f"{NOCACHE}:main")
    assert "--prompt-cache-size" not in old.kwargs["cold_cmd"]
    vlm: Any = presets.mlx_vlm_server()
    assert vlm.kwargs["supports_images"] is True  # the control
    text: Any = presets.mlx_vlm_server(images=False, flags=["--prefill-step-size 32"])
    assert text.kwargs["supports_images"] is False
    assert text.cmd == vlm.cmd + " --prefill-step-size 32"


def test_an_entrys_scenario_joins_the_runs_corpus(tmp_path: Path) -> None:
    from history_catalogue import CatalogueError, loads
    from test_history import CHECKS, GOOD

    bug = stub_bug(corpus="short_first_prompt.json", select="test_corpus")
    run = command(bug, "buggy", Path("p"), tmp_path)
    assert f"--rootdir={tmp_path}" in run.argv  # the project corpus: <rootdir>/fixtures/corpus
    plain = command(stub_bug(), "buggy", Path("p"), tmp_path)
    assert not any(w.startswith("--rootdir") for w in plain.argv)
    scenario = 'corpus = "short_first_prompt.json"'
    entry = GOOD.replace('runner = "mlx-lm"', f'runner = "mlx-lm"\n{scenario}')
    assert loads(CHECKS, entry)[0].corpus == "short_first_prompt.json"
    with pytest.raises(CatalogueError, match=r"no scenario 'nope\.json'"):
        loads(CHECKS, entry.replace("short_first_prompt", "nope"))


def test_the_short_first_prompt_is_under_mlx_vlm_1901s_guard() -> None:
    """The scenario reaches mlx-vlm #1901 only while its first prompt renders shorter than the
    exact-mode guard (APC_EXACT_PREFIX_GUARD_TOKENS, 16) on the entry's fixture, and its last
    request repeats a long one (the repeat that must reuse)."""
    from history_catalogue import CORPUS

    from pytest_prefixcache.adapters.http.render import TextRenderer
    from pytest_prefixcache.output.streams import load_stream

    requests, _ = load_stream(CORPUS / "short_first_prompt.json")
    render = TextRenderer(HERE.parent.parent / "fixtures" / "tiny-qwen3.5-vl")
    lengths = [len(render(r)[0]) for r in requests]
    assert lengths[0] < 16 <= lengths[1] - 16, lengths
    assert render(requests[1])[0] == render(requests[2])[0]
