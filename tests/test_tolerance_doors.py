"""One tolerance rule, whichever door (issue #32, item 4): the measured rule of a server follows
its program (mlx_lm.server, mlx_vlm.server) and its model directory's ``model_type``, read from
the server command, whether the engine is a preset or ``presets.from_env`` (what
``--prefixcache-server-cmd`` and ``prefixcache verify --server-cmd`` build). No server starts
here: the adapter class is replaced by a recorder of what each door sets. The rule's own
negative control (a one-token cache bug is far above it) is tests/test_tolerances.py's and
tests/test_decode_tolerance.py's, on the same table values asserted here."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from pytest_prefixcache.adapters import presets
from pytest_prefixcache.adapters.tolerances import (
    identify,
    model_dir_of,
    program_of,
    split_atol,
)
from pytest_prefixcache.package_data import fixture_model
from pytest_prefixcache.session.targets import SERVER_ENGINE


class Recorder:
    """Stands in for OpenAIEngine: keeps the command and what a door sets on it."""

    def __init__(self, cmd: Any = None, **kwargs: Any) -> None:
        self.cmd, self.kwargs = cmd, kwargs
        self.atol, self.tolerance_rule = 0.0, ""


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (presets.reference, presets.mlx_lm, presets.mlx_vlm, presets.server):
        monkeypatch.setattr(module, "OpenAIEngine", Recorder)
    for name in (
        "PREFIXCACHE_RENDER",
        "PREFIXCACHE_MODEL",
        "PREFIXCACHE_VOCAB",
        "PREFIXCACHE_CLAIMS",
    ):
        monkeypatch.delenv(name, raising=False)


def through_env(monkeypatch: pytest.MonkeyPatch, cmd: str, **env: str) -> Any:
    monkeypatch.setenv("PREFIXCACHE_SERVER_CMD", cmd)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return presets.from_env()


def test_the_server_command_names_the_library_and_the_model() -> None:
    model = fixture_model("tiny-gemma3-text")
    tapped = f"{presets.TAP} mlx_lm.server:main --model {shlex.quote(str(model))} --port {{port}}"
    assert program_of(tapped) == "mlx_lm.server" and model_dir_of(tapped) == str(model)
    assert program_of("/venv/bin/mlx_vlm.server --model=x") == "mlx_vlm.server"
    assert model_dir_of("/venv/bin/mlx_vlm.server --model=x") == "x"
    who = identify(tapped)
    assert (who.library, who.model_type) == ("mlx-lm", "gemma3_text")
    assert "mlx_lm.server" in who.how and "config.json" in who.how
    assert identify("llama-server -m x.gguf --port {port}").library == ""


@pytest.mark.parametrize(
    ("name", "atol"),
    [
        ("tiny-gemma3-text", split_atol("mlx-lm", "gemma3_text")),
        ("tiny-llama", None),
        ("tiny-qwen3.5", None),
    ],
)
def test_a_preset_and_a_server_command_get_the_same_rule(
    monkeypatch: pytest.MonkeyPatch, recorder: None, name: str, atol: float | None
) -> None:
    model = fixture_model(name)
    preset: Any = presets.mlx_lm_server(model)  # a Recorder
    assert SERVER_ENGINE == "pytest_prefixcache.adapters.presets:from_env"  # the server-cmd door
    door = through_env(monkeypatch, preset.cmd)
    for engine in (preset, door):
        assert (engine.atol or None) == atol
        assert getattr(engine, "decode_atol", None) is None  # gemma3_text: the split rule covers it
    assert door.tolerance_rule == preset.tolerance_rule
    if atol is not None:  # named the same way, with where the rule's keys were read
        assert "mlx-lm gemma3_text" in door.tolerance_rule
        assert "identified from the server command runs mlx_lm.server" in door.tolerance_rule
    else:  # exact where it holds: any cache bug still fails (the negative control)
        assert door.tolerance_rule == ""


def test_a_command_without_a_model_directory_reads_the_rendered_one(
    monkeypatch: pytest.MonkeyPatch, recorder: None
) -> None:
    model = fixture_model("tiny-gemma3-text")
    cmd = "{python} -m mlx_lm.server --model some/hub-name --port {port}"
    door = through_env(monkeypatch, cmd, PREFIXCACHE_RENDER=f"text:{model}")
    assert door.atol == split_atol("mlx-lm", "gemma3_text")
    # the negative control: no model directory anywhere, no rule (exact)
    plain = through_env(monkeypatch, cmd, PREFIXCACHE_RENDER="")
    assert plain.atol == 0.0 and plain.tolerance_rule == ""


def test_the_vlm_server_gets_the_mlx_vlm_rule_and_another_program_none(
    monkeypatch: pytest.MonkeyPatch, recorder: None
) -> None:
    vl = fixture_model("tiny-qwen3.5-vl")
    preset: Any = presets.mlx_vlm_server(vl)  # a Recorder
    door = through_env(monkeypatch, preset.cmd)
    assert preset.atol == door.atol == split_atol("mlx-vlm", "qwen3_5")
    assert getattr(door, "decode_atol", None) is None  # its split rule allows more
    assert door.tolerance_rule == preset.tolerance_rule
    # the same model behind a server of another library: not mlx-vlm's rule
    other = through_env(monkeypatch, f"llama-server --model {vl} --port {{port}}")
    assert other.atol == 0.0 and other.tolerance_rule == ""
