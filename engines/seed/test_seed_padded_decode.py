"""rapid-mlx 0.16.10's ``--mllm`` batched decode, without a server or the logit tap: the
shorter of two image requests in one decode step is wrong (engines/seed/padded_decode.py on
each seed environment's own mlx-vlm and mlx-lm; skipped where the environment is missing).

The saved wave (fixtures/corpus/third_party/rapid-mlx-waves-mllm-memory-b-w1024-decode-
equivalence) failed on the server at decode step 1 of the 32-token request, |diff| 0.652,
attributed by id; the same two requests here give the same figure with no tap: the logits
are the engine's, and the cause is mlx-vlm 0.7.2's Qwen2-VL language model, which rapid-mlx
0.16.10 pins: ``Qwen2Model.__call__`` passes the list of layer caches to
``create_attention_mask``, which only asks a cache object for ``make_mask`` and returns no
mask for one position, so a decode step attends the left padding ``BatchKVCache.merge`` put
before the shorter row (and ``Attention`` cuts an array mask to the new keys' length before
the cache update, so passing one does not help). mlx-vlm 0.7.10 (vllm-mlx 0.6.0's) unwraps a
cache list in ``create_attention_mask``: the same step is exact there."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pytest_prefixcache.adapters.seed import default_python

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("padded_decode.py")
WAVE = (
    ROOT / "fixtures/corpus/third_party" / "rapid-mlx-waves-mllm-memory-b-w1024-decode-equivalence"
)
MODEL = ROOT / "fixtures" / "tiny-qwen2-vl"

PADDED_DECODE = (
    "rapid-mlx 0.16.10 --mllm (mlx-vlm 0.7.2): in a batched decode step the shorter row attends "
    "its left padding (Qwen2Model passes the cache list to create_attention_mask: no mask for "
    "one position), |diff| 0.652 at decode step 1 of a 32-token image request beside a 75-token "
    "one; fixed in mlx-vlm 0.7.10"
)


def _run(engine: str) -> dict[str, Any]:
    python = default_python(engine)
    if not Path(python).is_file():
        pytest.skip(f"no {engine} environment at {python} (engines/seed/run.sh install)")
    image = next(WAVE.glob("img-*.png"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [python, str(SCRIPT), str(MODEL), str(image)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    # the probe is the saved wave's shape: unequal lengths, the same image (the same delta)
    assert (
        result["prompt_tokens"] == [32, 75] and result["rope_deltas"][0] == result["rope_deltas"][1]
    )
    # negative control of the comparison itself: with no padding the batched row is exact
    assert result["no_padding"] == [0.0], result
    return result


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=PADDED_DECODE)
def test_rapid_mlx_batched_decode_equals_each_row_alone() -> None:
    result = _run("rapid-mlx")
    assert result["mlx_vlm"] == "0.7.2", result
    assert result["server"] == [0.0, 0.0], f"batched vs alone |diff| per row: {result['server']}"


@pytest.mark.slow
def test_mlx_vlm_0_7_10_batched_decode_equals_each_row_alone() -> None:
    """The fixed library (vllm-mlx 0.6.0's environment): the same step is exact."""
    result = _run("vllm-mlx")
    assert result["mlx_vlm"] == "0.7.10", result
    assert result["server"] == [0.0, 0.0], result
