"""``pytest --prefixcache-verify`` with no engine option verifies the reference MLX engine."""

from __future__ import annotations

import importlib.util

import pytest

pytest_plugins = ["pytester"]

needs_mlx = pytest.mark.skipif(
    importlib.util.find_spec("mlx") is None or importlib.util.find_spec("mlx_vlm") is None,
    reason="the default reference engine needs MLX and mlx-vlm: "
    "pip install 'pytest-prefixcache[mlx]'",
)


@needs_mlx
@pytest.mark.slow
def test_default_verification_of_the_reference_engine_passes(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--prefixcache-verify",
                                           "--prefixcache-seed=1", "-v")  # fmt: skip
    result.stdout.fnmatch_lines(
        [
            "prefixcache: engine reference_engine:default_engine (default), * examples per "
            "property, tolerance exact or the engine's own rule, timeout 60 s",
            "*verification.py::test_corpus[[]omlx_image_edit_a_to_e[]] PASSED*",
            "*verification.py::test_request_streams PASSED*",
            "*verification.py::test_state_machine PASSED*",
            "engine: reference_engine:default_engine; tolerance: exact",
            "cache efficiency vs the token oracle: *",
            "worst |cached - uncached|: 0",
            "failures by check: none",
        ]
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("error", 0) == 0, outcomes
    assert outcomes["passed"] >= 7  # the corpus scenarios, the streams, the state machine
    assert "verdict: PASS" in result.stdout.str()
