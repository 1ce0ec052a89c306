"""Chunked prefill over recurrent checkpoints (issue #35 item 4, bug class 28): the reference
engine's ``prefill_step`` splits a chunk at every boundary inside it, so cold and warm runs cut
at the same absolute points and stay bit-exact; the ``snapshot_at_chunk_end`` mutant, which
files the state at a chunk's end under the boundaries inside it, fails the same stream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reference_engine.chunks import chunk_ends, prefill_cuts
from reference_engine.resume import checked_step


def test_a_prefill_cuts_at_every_boundary_and_every_chunk_end() -> None:
    assert prefill_cuts([5, 40, 70], 0, 100, 32) == [5, 32, 40, 64, 70, 96]
    # resuming at 40: the same absolute points past it, relative to it
    assert prefill_cuts([5, 40, 70], 40, 100, 32) == [64 - 40, 70 - 40, 96 - 40]
    assert prefill_cuts([5, 40, 70], 0, 100) == [5, 40, 70]  # no step: boundaries only
    assert chunk_ends(40, 100, 32) == [64, 96] and chunk_ends(0, 32, 32) == []


@pytest.mark.parametrize("bad", [0, -32, 1.5, "32"])
def test_a_bad_prefill_step_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(
        ValueError, match=f"prefill_step must be a positive int or None, got {bad!r}"
    ):
        checked_step(bad)


mx = pytest.importorskip("mlx.core")

from pytest_prefixcache.errors import EquivalenceFailure  # noqa: E402
from pytest_prefixcache.types import Message, Request  # noqa: E402
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions  # noqa: E402
from reference_engine import Engine  # noqa: E402
from reference_engine.mutants import MUTANTS  # noqa: E402

SYSTEM = Message("system", ("You are a careful assistant who answers in one short line.",))
STREAM = (
    Request((Message("user", ("describe the image",)),)),
    Request((Message("user", ("describe the image",)),)),  # resumes inside the one chunk
    Request((SYSTEM, Message("user", ("what colour is the sky at noon on a clear day",)))),
    Request((SYSTEM, Message("user", ("and at night",)))),  # shares the system turn
)
STEP = MUTANTS["snapshot_at_chunk_end"].options["prefill_step"]


def _verifier(engine: Engine, tmp_path: Path) -> Verifier:
    return Verifier(engine, options=VerifyOptions(failures_dir=tmp_path, timeout=600.0))


def test_the_engine_with_a_prefill_step_stays_bit_exact(models: Any, tmp_path: Path) -> None:
    model = models("tiny-qwen3.5-vl")
    engine = Engine(model, prefill_step=STEP)
    steps = _verifier(engine, tmp_path).run(STREAM)
    assert all(s.comparison.worst_diff == 0 for s in steps)
    last = steps[-1].cached
    # the shared system turn ends inside the first chunk: it resumes there, not at a chunk end
    assert last.cached_tokens and last.cached_tokens % STEP != 0
    assert len(last.token_ids or ()) > STEP
    # the baseline audit's fresh instance cuts where this one does (else it is not cold-equal)
    assert engine.fresh_instance().prefill_step == STEP


def test_the_mutant_fails_the_same_stream(models: Any, tmp_path: Path) -> None:
    """Negative control: the state at the chunk's end filed under the boundary inside it."""
    mutant = MUTANTS["snapshot_at_chunk_end"]
    assert mutant.bug_class == 28
    with pytest.raises(EquivalenceFailure):
        _verifier(mutant.build(models(mutant.model)), tmp_path).run(STREAM)
