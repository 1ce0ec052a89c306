"""A session whose engine ran MLX on the plugin's worker thread exits with pytest's own code.

When the worker thread that ran MLX work was stopped at close, about half of these runs
aborted at interpreter exit ("terminate called without an active exception", -6) after
reporting the failure correctly (11 of 20 in one measurement); draining the streams from the
main thread alone still left 1 of 4 in a CI run. Keeping the idle daemon alive and draining
from the main thread: 0 of 30, and 0 of 16 with both cores busy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlx.core")

CASE = (
    Path(__file__).resolve().parent.parent
    / "fixtures"
    / "corpus"
    / "mutants"
    / "mutant_placeholder_collision.json"
)


def test_failing_replay_exits_with_code_1_every_time(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--prefixcache-verify",
        "--prefixcache-engine=reference_engine.mutants:placeholder_collision",
        f"--prefixcache-replay={CASE}",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    codes = [
        subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=300).returncode
        for _ in range(4)
    ]
    assert codes == [1, 1, 1, 1]
