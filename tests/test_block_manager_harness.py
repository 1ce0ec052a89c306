"""The block-manager harness (reference_engine/harness): a paged engine's block manager and
scheduler under the suite, against an interface-faithful stand-in of nano-vllm's
(tests/block_manager_standin.py) and its planted bugs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlx.core")

import block_manager_standin as standin

from pytest_prefixcache import Message, Request
from pytest_prefixcache.errors import EngineError

pytest_plugins = ["pytester"]

STANDIN = Path(standin.__file__).read_text(encoding="utf-8")
#: The unchained-hash control's example budget, and the seeds it tries in order until one
#: catches the bug. A wrong hit needs a block whose 16 tokens recur at another block offset
#: of an earlier prompt, which generated text streams seldom hold, so a single seed is luck:
#: at 40 examples 7 of seeds 0-12 catch it (0, 3, 4, 6, 7, 10, 12), and every run of three
#: consecutive seeds from 0 to 9 holds one that does; seed 1 needs 320 examples
#: (benchmarks/harness_control_budget.py, benchmarks/results/closed_loop_share/README.md).
#: The correct manager passes the same run (the first seed).
CONTROL_EXAMPLES = 40
CONTROL_SEEDS = (3, 4, 5)
LONG = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron " * 3


def ask(text: str, *, system: str = "", max_new_tokens: int = 4) -> Request:
    head = (Message("system", (system,)),) if system else ()
    return Request((*head, Message("user", (text,))), max_new_tokens=max_new_tokens)


@pytest.fixture(scope="module")
def model() -> Iterator[object]:
    from reference_engine.harness import _model

    yield _model()


def harness(model: object, manager: type = standin.BlockManager, **kwargs: object) -> object:
    from reference_engine.harness import BlockManagerEngine

    kwargs.setdefault("scheduler", standin.Scheduler)
    return BlockManagerEngine(
        model,  # type: ignore[arg-type]
        block_manager=manager,
        sequence=standin.Sequence,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("manager", "scheduler"),
    [
        (standin.BlockManager, standin.Scheduler),
        (standin.BlockManager, None),
        (standin.ClassicBlockManager, standin.ClassicScheduler),
        (standin.ClassicBlockManager, None),
    ],
    ids=["scheduler", "alone", "classic-scheduler", "classic-alone"],
)
def test_a_correct_block_manager_reuses_whole_blocks_bit_exact(model, manager, scheduler) -> None:
    """Both generations of nano-vllm's interface, through the scheduler and alone."""
    engine = harness(model, manager, scheduler=scheduler)
    # 40 new tokens: decoding crosses block boundaries (may_append, decode rows in new blocks)
    first, second = ask(LONG), ask(LONG + " And one more question?", max_new_tokens=40)
    engine.run(first, use_cache=True)
    warm, cold = engine.run(second, use_cache=True), engine.run(second, use_cache=False)
    assert warm.prompt_tokens == cold.prompt_tokens
    # The shared prefix ends inside the user turn: whole blocks of 16 before it are reused.
    assert 0 < warm.cached_tokens < warm.prompt_tokens
    assert warm.cached_tokens % 16 == 0
    assert warm.tokens == cold.tokens and len(warm.tokens) > 32
    for a, b in zip(warm.step_logits, cold.step_logits, strict=True):
        np.testing.assert_array_equal(a, b)
    assert cold.cached_tokens == 0


def test_a_chunked_prefill_reads_its_own_earlier_chunks_bit_exact(model) -> None:
    """A budget of 24 tokens per step: the scheduler prefills a prompt in chunks, each chunk
    reading the KV the earlier ones wrote into their blocks; a next request then reuses blocks
    written chunk by chunk. Both bit-exact; the cached tokens are the allocation's."""
    engine = harness(model, batched_tokens=24)
    first = ask(LONG, max_new_tokens=8)
    second = ask(LONG + " And one more question?", max_new_tokens=8)
    for request, reused in ((first, False), (second, True)):
        warm, cold = engine.run(request, use_cache=True), engine.run(request, use_cache=False)
        assert warm.prompt_tokens > 4 * 24
        assert (warm.cached_tokens > 0) == reused
        assert warm.tokens == cold.tokens
        for a, b in zip(warm.step_logits, cold.step_logits, strict=True):
            np.testing.assert_array_equal(a, b)


def test_the_model_reads_the_blocks_the_manager_assigned(model) -> None:
    """Negative control at the harness level: a freed block still indexed (StaleHit) is
    handed out again, overwritten, then hit by the prompt it used to hold; the model reads the
    overwriting KV, so the logits differ. The correct manager, under the same pressure, reuses
    nothing stale (the blocks were recycled) and stays exact."""
    other = ask("zz " * 60)
    for manager, broken in ((standin.BlockManager, False), (standin.StaleHit, True)):
        engine = harness(model, manager, num_blocks=14)
        engine.run(ask(LONG), use_cache=True)
        engine.run(other, use_cache=True)  # recycles the first prompt's blocks
        warm = engine.run(ask(LONG), use_cache=True)
        cold = engine.run(ask(LONG), use_cache=False)
        differs = not np.array_equal(warm.logits, cold.logits)
        assert (warm.cached_tokens > 0 and differs) if broken else not differs, manager


def test_decode_steps_read_the_blocks_may_append_assigned(model) -> None:
    """Negative control of the decode path: a manager that hands a sequence its own last block
    again when decoding crosses into a new one makes the steps after that boundary read
    overwritten rows; the first token (before it) stays exact."""
    engine = harness(model, standin.AppendReusesLastBlock)
    request = ask(LONG, max_new_tokens=40)
    warm, cold = engine.run(request, use_cache=True), engine.run(request, use_cache=False)
    np.testing.assert_array_equal(warm.logits, cold.logits)
    assert any(not np.array_equal(a, b) for a, b in zip(warm.step_logits, cold.step_logits))


def test_a_manager_that_caches_the_whole_prompt_is_refused(model) -> None:
    """A manager reporting every prompt token as cached leaves no position to compute the next
    token's logits from: the harness refuses (an engine fault), never invents them."""
    engine = harness(model, standin.FullPromptHit)
    whole = next(
        r
        for r in (ask(LONG + "x" * k) for k in range(64))
        if engine.run(r, use_cache=False).prompt_tokens % 16 == 0
    )
    engine.run(whole, use_cache=True)
    with pytest.raises(EngineError, match="as cached: no position left"):
        engine.run(whole, use_cache=True)


def test_a_model_with_non_kv_layer_state_is_refused() -> None:
    """Recurrent and sliding-window layers keep state a block table does not address."""
    from types import SimpleNamespace

    from reference_engine.harness import BlockManagerEngine

    hybrid = SimpleNamespace(
        stateful_layers=(0, 1, 2), path="tiny-qwen3.5-vl", model_type="qwen3_5"
    )
    with pytest.raises(EngineError, match=r"full-attention models only .*qwen3_5"):
        BlockManagerEngine(
            hybrid,  # type: ignore[arg-type]
            block_manager=standin.BlockManager,
            sequence=standin.Sequence,
        )


def test_a_block_table_too_short_is_a_clear_error() -> None:
    from reference_engine.harness import PagedKV

    with pytest.raises(EngineError, match=r"block table has 1 blocks \(\[3\]\) for 20 positions"):
        PagedKV(8, 16).windows([3], 20)
    with pytest.raises(EngineError, match="block id 9 in the block table"):
        PagedKV(8, 16).windows([9], 4)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "PREFIXCACHE_BLOCK_MANAGER is not set"),
        ({"PREFIXCACHE_BLOCK_MANAGER": "nocolon"}, "is not MODULE:ATTR"),
        ({"PREFIXCACHE_BLOCK_MANAGER": "no_such_mod:X"}, "importing 'no_such_mod' failed"),
        ({"PREFIXCACHE_BLOCK_MANAGER": "block_manager_standin:Nope"}, "has no attribute 'Nope'"),
        (
            {"PREFIXCACHE_BLOCK_MANAGER": "block_manager_standin:BlockManager",
             "PREFIXCACHE_NUM_BLOCKS": "-3"},
            "PREFIXCACHE_NUM_BLOCKS='-3' is not a positive integer",
        ),
    ],
)  # fmt: skip
def test_from_env_names_the_bad_variable(monkeypatch, env, message) -> None:
    from reference_engine.harness import from_env

    for k in ("PREFIXCACHE_BLOCK_MANAGER", "PREFIXCACHE_SEQUENCE", "PREFIXCACHE_SCHEDULER"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(EngineError, match=message):
        from_env()


@pytest.mark.slow
def test_the_suite_passes_a_correct_block_manager(pytester, monkeypatch) -> None:
    pytester.makepyfile(block_manager_standin=STANDIN)
    for k, v in {
        "PREFIXCACHE_BLOCK_MANAGER": "block_manager_standin:BlockManager",
        "PREFIXCACHE_SCHEDULER": "block_manager_standin:Scheduler",
        "PREFIXCACHE_NUM_BLOCKS": "64",
    }.items():
        monkeypatch.setenv(k, v)
    result = pytester.runpytest(*_argv(CONTROL_EXAMPLES, CONTROL_SEEDS[0]))
    result.stdout.fnmatch_lines(
        [
            "cache efficiency vs the block reference (blocks of 16): 100.0% *",
            "failures by check: none",
            "verdict: PASS",
        ]
    )


@pytest.mark.slow
def test_the_suite_catches_an_unchained_hash_and_shrinks_it(pytester, monkeypatch) -> None:
    pytester.makepyfile(block_manager_standin=STANDIN)
    for k, v in {
        "PREFIXCACHE_BLOCK_MANAGER": "block_manager_standin:UnchainedHash",
        "PREFIXCACHE_SCHEDULER": "block_manager_standin:Scheduler",
        "PREFIXCACHE_NUM_BLOCKS": "64",
    }.items():
        monkeypatch.setenv(k, v)
    for seed in CONTROL_SEEDS:  # deterministic per seed; the next ones if a change moves it
        result = pytester.runpytest(*_argv(CONTROL_EXAMPLES, seed))
        if result.ret != 0:
            break
    result.stdout.fnmatch_lines(
        [
            "E   pytest_prefixcache.errors.EquivalenceFailure: equivalence: logits differ *",
            "failures by check: equivalence: *",
            "verdict: FAIL",
        ]
    )
    saved = list((pytester.path / ".prefixcache" / "failures").glob("*/stream.json"))
    assert saved, "the shrunk counterexample is saved for replay"


def _argv(examples: int, seed: int) -> list[str]:
    return [
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "--prefixcache-verify",
        "--prefixcache-engine=reference_engine.harness:from_env",
        f"--prefixcache-examples={examples}",
        f"--prefixcache-seed={seed}",
        "--pyargs",
        "pytest_prefixcache.suite",
    ]
