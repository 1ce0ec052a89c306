"""A fixture served under a hub repository's name (adapters/hub_alias.py): the layout a loader
resolves offline, the launcher that lays it out in the server's HOME, and the seed engines'
command lines with ``served_as``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_prefixcache.adapters import seed
from pytest_prefixcache.adapters.hub_alias import MODULE, alias_env, launcher, lay_out
from pytest_prefixcache.errors import EngineError
from pytest_prefixcache.package_data import FIXTURES

LLAMA = FIXTURES / "tiny-llama"
REPO = "mlx-community/Tmax-9B-MLX-4bit"
ROOT = Path(__file__).resolve().parents[1]
#: what a loader does with a repository id offline (mlx_lm.utils.get_model_path's call)
RESOLVE = "from huggingface_hub import snapshot_download as s; print(s({!r}))"


def resolve(cache: Path, repo: str, *launch: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = str(ROOT)
    argv = [*(launch or (sys.executable,)), "-c", RESOLVE.format(repo)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def test_the_launcher_lays_out_the_fixture_that_an_offline_loader_then_finds(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "hub"
    missing = resolve(cache, REPO)  # the negative control: no layout, nothing found offline
    assert missing.returncode != 0
    done = resolve(cache, REPO, *launcher(sys.executable, REPO, LLAMA))
    assert done.returncode == 0, done.stderr
    found = Path(done.stdout.strip().splitlines()[-1])
    assert (found / "config.json").resolve() == (LLAMA / "config.json").resolve()
    assert sorted(p.name for p in found.iterdir()) == sorted(
        p.name for p in LLAMA.iterdir() if p.is_file()
    )
    other = resolve(cache, "mlx-community/Another-Model")  # only the name laid out resolves
    assert other.returncode != 0


def test_a_layout_is_made_once_and_kept(tmp_path: Path) -> None:
    first = lay_out(tmp_path, REPO, LLAMA)
    again = lay_out(tmp_path, REPO, LLAMA)
    assert first == again and (first.parent.parent / "refs" / "main").read_text() == first.name


@pytest.mark.parametrize("repo", ["tmax-9b", "a/b/c", "org/ name", "/name"])
def test_a_name_that_is_not_a_repository_id_is_refused(repo: str, tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="is not a hub repository id"):
        lay_out(tmp_path, repo, LLAMA)
    assert not any(tmp_path.iterdir())


def test_a_directory_without_a_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"has no config\.json"):
        lay_out(tmp_path / "hub", REPO, tmp_path)


def test_the_launcher_names_a_missing_cache_and_bad_words() -> None:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_CACHE"}
    env["PYTHONPATH"] = str(ROOT)
    words = [sys.executable, "-m", MODULE, f"{REPO}={LLAMA}", "--", "-c", "pass"]
    done = subprocess.run(words, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode != 0 and "HF_HUB_CACHE is not set" in done.stderr
    bad = subprocess.run(words[:3], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode != 0 and "usage:" in bad.stderr


def test_the_seed_servers_are_given_the_name_and_laid_out_first() -> None:
    cmd, cold = seed.commands("rapid-mlx", [], "/v/bin/python", LLAMA, served_as=REPO)
    start = ["/v/bin/python", "-m", MODULE, f"{REPO}={LLAMA.resolve()}", "--"]
    for argv in (cmd, cold):
        assert argv[: len(start)] == start
        assert argv[argv.index("serve") + 1] == REPO and str(LLAMA) not in argv[len(start) :]
    plain, _ = seed.commands("rapid-mlx", [], "/v/bin/python", LLAMA)
    assert plain[0] == "/v/bin/python" and plain[plain.index("serve") + 1] == str(LLAMA)
    assert alias_env() == {"HF_HUB_CACHE": "{home}/hub", "HF_HUB_OFFLINE": "1"}


def test_the_requests_name_the_model_as_the_server_was_given_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[dict[str, object]] = []

    class Stub:  # the engine's arguments, no server started
        def __init__(self, *args: object, **kwargs: object) -> None:
            made.append(kwargs)

    monkeypatch.setattr(seed, "OpenAIEngine", Stub)
    monkeypatch.setattr(seed, "with_measured_rules", lambda e, **_: e)
    seed.seed_server("rapid-mlx", python=sys.executable, model_dir=LLAMA, served_as=REPO)
    seed.seed_server("rapid-mlx", python=sys.executable, model_dir=LLAMA)
    assert made[0]["model"] == REPO  # rapid-mlx answers 404 to any other model name
    assert made[0]["vocab"] == LLAMA and "HF_HUB_CACHE" in made[0]["env"]  # type: ignore[operator]
    assert made[1]["model"] == str(LLAMA) and "HF_HUB_CACHE" not in made[1]["env"]  # type: ignore[operator]
