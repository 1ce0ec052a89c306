"""Checks of a seed engine (vllm-mlx, rapid-mlx) through the HTTP adapter and the logit tap.

Skipped unless scripts/seed_engines.sh runs it: it sets SEED_ENGINE (vllm-mlx or rapid-mlx),
SEED_MODE (simple, mllm, cb, paged), SEED_PYTHON (the engine venv's python) and SEED_CLI (the
CLI function, MODULE:FUNC). The server runs that CLI under the tap; the uncached baseline is a
second server started with --disable-prefix-cache. Every comparison uses the tap's
full-vocabulary log-softmax, exact (MLX on CPU).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator

import pytest
from adapter_support import SYSTEM, assistant, img, record_finding, req, user, worst_diff

from pytest_prefixcache.adapters.chat import FIXTURES
from pytest_prefixcache.adapters.openai import OpenAIEngine

ENGINE = os.environ.get("SEED_ENGINE", "")
MODE = os.environ.get("SEED_MODE", "simple")
pytestmark = pytest.mark.skipif(not ENGINE, reason="opt-in: run scripts/seed_engines.sh")

FLAGS = {
    "simple": [],
    "mllm": ["--mllm"],
    "cb": ["--continuous-batching"],
    "paged": ["--continuous-batching", "--use-paged-cache"],
}
if ENGINE == "rapid-mlx":  # only a batched engine: no --continuous-batching flag
    FLAGS.update(cb=[], paged=["--use-paged-cache"])
#: The endpoint that empties the prefix cache. rapid-mlx 0.16.10's DELETE /v1/cache ("Clear
#: all caches") clears only mlx-vlm's multimodal caches: it answers 200 with {"error": "Cache
#: clear not available (mlx_vlm not loaded)"} and a repeat still reuses 88 of 89 tokens after
#: it (the tap); its POST /v1/cache/clear empties the prefix cache (then 0 of 89).
RESET = ("/v1/cache/clear", "POST") if ENGINE == "rapid-mlx" else ("/v1/cache", "DELETE")
MODEL = FIXTURES / ("tiny-qwen2-vl" if MODE == "mllm" else "tiny-llama")
IMAGES = MODE == "mllm"
A, B = img(1), img(2)
TEXT = req(SYSTEM, user("Hello there, how are you today? Tell me a long story about cats."))
TEXT_NEXT = req(*TEXT.messages, assistant("fine"), user("and now?"))
IMAGE = req(SYSTEM, user(A, "What is in this image?"))


def commands() -> tuple[str, str]:
    """The cached and the uncached server command lines."""
    python = os.environ.get("SEED_PYTHON", "python")
    cli = os.environ.get("SEED_CLI", "vllm_mlx.cli:main")
    argv = [python, "-m", "pytest_prefixcache.tap", cli, "serve", str(MODEL)]
    argv += ["--host", "127.0.0.1", "--port", "{port}"]
    # the baseline keeps the engine's mode but no cache (rapid-mlx refuses a paged store
    # without the prefix cache)
    cold = [f for f in FLAGS[MODE] if f != "--use-paged-cache"]
    return shlex.join([*argv, *FLAGS[MODE]]), shlex.join([*argv, *cold, "--disable-prefix-cache"])


def exports() -> str:
    """Shell exports configuring ``presets:from_env`` for the same servers."""
    cmd, cold = commands()
    env = {
        "PREFIXCACHE_SERVER_CMD": cmd,
        "PREFIXCACHE_COLD": "server",
        "PREFIXCACHE_COLD_CMD": cold,
        "PREFIXCACHE_TAP_SERVER": "1",
        "PREFIXCACHE_MODEL": str(MODEL),
        "PREFIXCACHE_TEXT_ONLY": "0" if IMAGES else "1",
        "PREFIXCACHE_RESET_PATH": RESET[0],
        "PREFIXCACHE_RESET_METHOD": RESET[1],
        "PREFIXCACHE_RENDER": f"{'vlm' if IMAGES else 'text'}:{MODEL}",
    }
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


MROPE_STALE = (
    "rapid-mlx 0.16.10 --mllm: a text request longer than the text request before it fails "
    "in mlx-vlm's mRoPE ([broadcast_shapes] Shapes (1,4,110,16) and (1,1,89,16): the previous "
    "prompt's position embeddings are applied to the new one), with or without the prefix "
    "cache, and the API answers 503 'Request cancelled by model replacement'"
)
NO_REUSE = "an identical repeat prefills the whole prompt again (the tap saw 0 tokens reused)"
#: Findings seen on the tiny fixtures (engine, mode, test) -> reason; XPASS once fixed. Each
#: failed as stated in the clean run of scripts/seed_engines.sh at commit 9d98657 (its
#: checks run under --runxfail), and no other check failed there.
KNOWN = {
    ("vllm-mlx", "simple", "test_repeat_reuses"): f"vllm-mlx 0.6.0 simple engine: {NO_REUSE}",
    ("vllm-mlx", "cb", "test_repeat_reuses"): f"vllm-mlx 0.6.0 --continuous-batching: {NO_REUSE}",
    ("vllm-mlx", "mllm", "test_repeat_reuses"): f"vllm-mlx 0.6.0 --mllm, text: {NO_REUSE}",
    ("rapid-mlx", "mllm", "test_repeat_reuses"): f"rapid-mlx 0.16.10 --mllm, text: {NO_REUSE}",
    ("rapid-mlx", "simple", "test_api_agrees_with_the_tap"): "rapid-mlx 0.16.10: on an exact "
    "repeat usage.prompt_tokens_details.cached_tokens is the whole prompt (89 of 89) while the "
    "tap saw the last token prefilled again (88 reused)",
    ("rapid-mlx", "mllm", "test_text_stream"): MROPE_STALE,
    ("rapid-mlx", "mllm", "test_api_agrees_with_the_tap"): MROPE_STALE,
}


@pytest.fixture(autouse=True)
def _known_findings(request: pytest.FixtureRequest) -> None:
    reason = KNOWN.get((ENGINE, MODE, request.node.originalname))
    if reason:  # strict: a fix shows as XPASS(strict)
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))


@pytest.fixture(scope="module")
def engine() -> Iterator[OpenAIEngine]:
    cmd, cold = commands()
    with OpenAIEngine(
        cmd,
        cold="server",
        cold_cmd=cold,
        model=str(MODEL),
        supports_images=IMAGES,
        tap=True,
        reset_path=RESET[0],
        reset_method=RESET[1],
        start_timeout=300,
        timeout=300,
    ) as e:
        yield e


def record(**fields: object) -> None:
    """Append one measurement to $SEED_FINDINGS (JSON lines), if set."""
    record_finding("SEED_FINDINGS", ENGINE, MODE, **fields)


def check(engine: OpenAIEngine, request: object) -> int:
    """Cached vs cold through the tap: bit-exact; returns the reuse the tap saw."""
    cached = engine.run(request, use_cache=True)  # type: ignore[arg-type]
    cold = engine.run(request, use_cache=False)  # type: ignore[arg-type]
    diff = worst_diff(cached, cold)
    record(
        reused=cached.cached_tokens,
        prompt=cached.prompt_tokens,
        cold_reused=cold.cached_tokens,
        worst_diff=diff,
        disagreements=len(engine.tap_disagreements),
    )
    assert cold.cached_tokens == 0, f"the cold server reused {cold.cached_tokens} tokens"
    assert diff == 0.0, (
        f"{ENGINE} {MODE}: cached vs uncached differ by {diff} with {cached.cached_tokens} of "
        f"{cached.prompt_tokens} prompt tokens reused"
    )
    return cached.cached_tokens or 0


def test_text_stream(engine: OpenAIEngine) -> None:
    check(engine, TEXT)
    check(engine, TEXT_NEXT)


def test_repeat_reuses(engine: OpenAIEngine) -> None:
    check(engine, TEXT)
    assert check(engine, TEXT) > 0, "an identical repeat reused nothing"


def test_api_agrees_with_the_tap(engine: OpenAIEngine) -> None:
    check(engine, TEXT)
    check(engine, TEXT_NEXT)
    assert engine.tap_disagreements == []


@pytest.mark.skipif(not IMAGES, reason="text-only mode")
@pytest.mark.parametrize(
    "history, final",
    [
        ([IMAGE], req(SYSTEM, user(B, "What is in this image?"))),
        ([req(SYSTEM, user(A, "and", B, "compare"))], req(SYSTEM, user(B, "and", A, "compare"))),
        ([IMAGE], req(*IMAGE.messages, assistant("a cat"), user("and the colour?"))),
        ([IMAGE], IMAGE),
    ],
    ids=["other-image-same-size", "swapped-order", "next-turn", "repeat"],
)
def test_image_streams(engine: OpenAIEngine, history: list[object], final: object) -> None:
    for request in history:
        engine.run(request, use_cache=True)  # type: ignore[arg-type]
    check(engine, final)
