"""The block-manager harness driving a scheduler that hands its model runner batch objects
(reference_engine/harness/batches.py), against an interface-faithful stand-in of ATOM's
(tests/scheduler_standin.py) and the scheduler bugs planted in it: bugs in the batch and the
post-processing, which a block manager driven alone never shows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlx.core")

import block_manager_standin
import scheduler_standin as standin

from pytest_prefixcache import Image, Message, Request
from pytest_prefixcache.errors import EngineError

pytest_plugins = ["pytester"]

LONG = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron " * 3
SYSTEM = Message("system", ("You are a careful visual assistant. Look at every detail. " * 2,))


def solid(rgb: tuple[int, int, int]) -> Image:
    return Image(np.full((32, 32, 3), rgb, dtype=np.uint8))


RED, BLUE = solid((255, 0, 0)), solid((0, 0, 255))


def ask(*content: object, max_new_tokens: int = 6) -> Request:
    return Request((SYSTEM, Message("user", content)), max_new_tokens=max_new_tokens)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def model() -> Iterator[object]:
    from reference_engine.harness import _model

    yield _model()


def harness(model: object, scheduler: type = standin.Scheduler, **kwargs: object) -> object:
    from reference_engine.harness import BlockManagerEngine

    return BlockManagerEngine(
        model,  # type: ignore[arg-type]
        block_manager=block_manager_standin.BlockManager,
        sequence=standin.Sequence,
        scheduler=scheduler,
        images=True,
        **kwargs,  # type: ignore[arg-type]
    )


def served(engine: object, request: Request) -> tuple[object, object, bool]:
    """The cached and the cold outcome, and whether they agree bit for bit."""
    warm = engine.run(request, use_cache=True)  # type: ignore[attr-defined]
    cold = engine.run(request, use_cache=False)  # type: ignore[attr-defined]
    same = warm.tokens == cold.tokens and all(
        np.array_equal(a, b) for a, b in zip(warm.step_logits, cold.step_logits, strict=True)
    )
    return warm, cold, same


@pytest.mark.parametrize(
    ("scheduler", "batched_tokens"),
    [
        (standin.Scheduler, 1 << 16),
        (standin.Scheduler, 24),
        (standin.FinalChunkScheduler, 24),
    ],
    ids=["whole", "chunked", "chunked-final-output"],
)
def test_a_correct_batch_scheduler_is_exact_and_reuses(model, scheduler, batched_tokens) -> None:
    """Text and images, whole prompts and chunks of 24 with deferred outputs (every chunk's,
    or, as ATOM main, only those of chunks that end a prompt): every reply bit-exact; a next
    request reuses whole blocks, a same-size other image only the blocks before its first
    placeholder, an identical image request blocks past its image."""
    engine = harness(model, scheduler, batched_tokens=batched_tokens)
    for request, reuse in (
        (ask(LONG), "none"),
        (ask(LONG + " And one more question?"), "some"),
        (ask(RED, "What colour is this?"), "some"),  # the system prompt
        (ask(BLUE, "What colour is this?"), "before the image"),
        (ask(RED, "What colour is this?"), "past the image"),
    ):
        warm, cold, same = served(engine, request)
        assert same, (request, warm.tokens, cold.tokens)  # type: ignore[attr-defined]
        cached = warm.cached_tokens  # type: ignore[attr-defined]
        image = (warm.image_spans or [(0, 0)])[0]  # type: ignore[attr-defined]
        assert cached % 16 == 0, cached
        assert {
            "none": cached == 0,
            "some": cached > 0,
            "before the image": 0 < cached <= image[0],
            "past the image": cached >= image[1],
        }[reuse], (reuse, cached, image)


def test_a_batch_that_moves_the_images_loses_them_in_later_chunks(model) -> None:
    """Negative control of the batch: ATOM's ScheduledBatch moves a sequence's images into
    itself; prefilled in chunks, the image (beyond the first chunk) is computed from its
    placeholder tokens and the logits differ. Whole prompts stay exact (one batch)."""
    request = ask(RED, "What colour is this?")
    for batched_tokens, broken in ((1 << 16, False), (24, True)):
        engine = harness(model, standin.ImagesMovedScheduler, batched_tokens=batched_tokens)
        warm, _, same = served(engine, request)
        assert warm.image_spans[0][0] >= 24  # type: ignore[attr-defined]
        assert same != broken, batched_tokens


def test_a_postprocess_that_keeps_a_stale_chunk_token_is_caught(model) -> None:
    """Negative control of the post-processing: the deferred token the last chunk of a
    chunked prefill sees belongs to the chunk before it; kept as the first generated token,
    the reply differs (or the next decode reads a position never computed: refused)."""
    request = ask(LONG)
    for batched_tokens, broken in ((1 << 16, False), (24, True)):
        engine = harness(model, standin.StaleTokenScheduler, batched_tokens=batched_tokens)
        try:
            _, _, same = served(engine, request)
        except EngineError:
            same = False
        assert same != broken, batched_tokens


def test_a_batch_of_other_requests_is_a_clear_error(model) -> None:
    class Foreign(standin.Scheduler):
        def schedule(self):  # type: ignore[no-untyped-def]
            result = super().schedule()
            if result is not None:
                result[0].req_ids = [-7]
            return result

    with pytest.raises(EngineError, match=r"holds requests \[-7\], not the one added"):
        harness(model, Foreign).run(ask(LONG), use_cache=True)  # type: ignore[attr-defined]


STANDINS = {
    mod.__name__: Path(str(mod.__file__)).read_text(encoding="utf-8")
    for mod in (block_manager_standin, standin)
}


@pytest.mark.parametrize(
    ("scheduler", "lines"),
    [
        ("Scheduler", ["failures by check: none", "verdict: PASS"]),
        pytest.param(
            "ImagesMovedScheduler",
            ["failures by check: *shapes: *", "verdict: FAIL"],
            marks=pytest.mark.slow,  # shrinking its failures: about 50 s on 2 cores
        ),
    ],
    ids=["correct", "images-moved"],
)
def test_the_suite_judges_a_batch_scheduler(pytester, monkeypatch, scheduler, lines) -> None:
    """The whole suite, with images and chunks of 32: the correct stand-in passes, the
    scheduler whose batch moves the images fails and its counterexample is saved."""
    pytester.makepyfile(**STANDINS)
    for k, v in {
        "PREFIXCACHE_BLOCK_MANAGER": "block_manager_standin:BlockManager",
        "PREFIXCACHE_SEQUENCE": "scheduler_standin:Sequence",
        "PREFIXCACHE_SCHEDULER": f"scheduler_standin:{scheduler}",
        "PREFIXCACHE_BLOCK_MANAGER_IMAGES": "1",
        "PREFIXCACHE_BATCHED_TOKENS": "32",
        "PREFIXCACHE_NUM_BLOCKS": "64",
    }.items():
        monkeypatch.setenv(k, v)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning",
        "--prefixcache-verify", "--prefixcache-engine=reference_engine.harness:from_env",
        "--prefixcache-examples=5", "--prefixcache-seed=1", "--pyargs", "pytest_prefixcache.suite",
    )  # fmt: skip
    result.stdout.fnmatch_lines(lines)
    saved = list((pytester.path / ".prefixcache" / "failures").glob("*/stream.json"))
    assert bool(saved) == (scheduler != "Scheduler")
