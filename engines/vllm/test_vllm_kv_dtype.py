"""#35 on vLLM CPU: does ``--kv-cache-dtype fp8*`` quantize the KV on the CPU backend, and is a
hit still its cold run?

Opt-in (VLLM_KV_DTYPE=1, with VLLM_PYTHON and VLLM_MODELS as for test_vllm_lora.py). CPU
attention lists ``auto``, ``fp8``, ``fp8_e4m3`` and ``fp8_e5m2`` (``CPUAttentionBackend
.supported_kv_cache_dtypes``, ``v1/attention/backends/cpu_attn.py``; fp8 needs AVX-512 or
AMX and a head size divisible by 32, ``_get_attn_isa``). One server per dtype on
tiny-llama-hf; the same prompt cold (a fresh salt) and as a repeat, every decode step over
the whole vocabulary (488). The negative control inside the test: an fp8 format's cold answer
must differ from ``auto``'s (else the flag changed nothing and "a hit equals cold" would say
nothing about quantized KV).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab.records import step_diff
from lab.scenarios import TEXT

from pytest_prefixcache import Outcome
from pytest_prefixcache.adapters.presets import vllm_server

pytestmark = pytest.mark.skipif(
    os.environ.get("VLLM_KV_DTYPE") != "1", reason="opt-in: VLLM_KV_DTYPE=1 (four vLLM servers)"
)

VOCAB = 488
DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, tuple[Outcome, Outcome, Outcome]]]:
    """(cold, first, repeat) per dtype, one server each, started one after another."""
    model = Path(os.environ.get("VLLM_MODELS", ".engines/vllm/models")) / "tiny-llama-hf"
    python = os.environ.get("VLLM_PYTHON", "python")
    out: dict[str, tuple[Outcome, Outcome, Outcome]] = {}
    for dtype in DTYPES:
        flags = () if dtype == "auto" else ("--kv-cache-dtype", dtype)
        with vllm_server(model, python=python, flags=flags, top_logprobs=VOCAB, audit=False) as e:
            cold = e.run(TEXT, use_cache=False)
            first = e.run(TEXT, use_cache=True)
            out[dtype] = (cold, first, e.run(TEXT, use_cache=True))
    yield out


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_hit_equals_its_cold_run(runs: dict[str, tuple[Outcome, ...]], dtype: str) -> None:
    cold, first, again = runs[dtype]
    print(
        f"{dtype}: repeat cached {again.cached_tokens} of {again.prompt_tokens}; diff to cold "
        f"{step_diff(again, cold):.4g}; vs auto's cold {step_diff(cold, runs['auto'][0]):.4g}"
    )
    assert (again.cached_tokens or 0) > 0, "the repeat reused nothing"
    assert step_diff(first, cold) == 0 and step_diff(again, cold) == 0


@pytest.mark.parametrize("dtype", DTYPES[1:])
def test_fp8_changes_the_answer(runs: dict[str, tuple[Outcome, ...]], dtype: str) -> None:
    assert step_diff(runs[dtype][0], runs["auto"][0]) > 0, f"{dtype} computed as auto did"
