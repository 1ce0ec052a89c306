"""The reference engine on the hybrid (Qwen3.5) and sliding-window (Gemma 3) fixtures.

Cached runs are bit-identical to cold runs on both; reuse resumes at the longest stored boundary
(turn start, turn content start, image edge) not beyond the match, a growing chat resumes at the
whole previous prompt and an exact repeat at its generation prompt's turn start; snapshots live
in the pool's byte budget; the cut schedule is what makes the hybrid exact (negative control:
mlx-vlm's qwen3_5 split elsewhere is not bit-identical).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from test_engine import SYSTEM, assistant, img, req, user  # noqa: E402

from pytest_prefixcache import Request  # noqa: E402
from pytest_prefixcache.package_data import fixture_model  # noqa: E402
from reference_engine import Engine, resume  # noqa: E402
from reference_engine import engine as engine_module  # noqa: E402
from reference_engine.blocks import namespace_root  # noqa: E402
from reference_engine.families import FULL, RECURRENT, WINDOW  # noqa: E402
from reference_engine.model import LoadedModel, load_model  # noqa: E402
from reference_engine.snapshots import boundaries  # noqa: E402

FAMILIES = ["tiny-qwen3.5-vl", "tiny-gemma3", "tiny-gemma4"]
#: The hybrid recurrent family's tests take 6-13 s each on 2 cores: the slow lane.
PARAMS = [pytest.param(f, marks=pytest.mark.slow) if "qwen3.5" in f else f for f in FAMILIES]


@pytest.fixture(scope="module", params=PARAMS)
def family(request: pytest.FixtureRequest) -> LoadedModel:
    return load_model(fixture_model(request.param))


def diff(a: Any, b: Any) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a.step_logits, b.step_logits))


def generation_start(family: LoadedModel, engine: Engine, r: Request) -> int:
    """Where the generation prompt's turn starts in ``r``'s rendering (an exact repeat
    resumes there: its last boundary before the prompt's end)."""
    ids = engine.run(r, use_cache=False).token_ids or ()
    return max(i for i, t in enumerate(ids) if t == family.turn_start_id)


def conversation() -> list[Request]:
    """A growing chat with two images, a repeat, a new user turn, a replaced image."""
    u1 = user("Describe this picture, please, in a few words.", img(1))
    a1 = assistant("It is a square of colourful noise, nothing more.")
    u2 = user("And this one?", img(2), "Compare them.")
    return [
        req(SYSTEM, u1),
        req(SYSTEM, u1, a1, u2),
        req(SYSTEM, u1, a1, u2),
        req(SYSTEM, user("Describe something else entirely, with no image at all.")),
        req(SYSTEM, u1, a1, user("And this one?", img(3), "Compare them.")),
        req(SYSTEM, user("Describe this picture, please, in a few words.", img(2))),
    ]


def test_layer_kinds(family: LoadedModel) -> None:
    kinds = set(family.kinds)
    assert FULL in kinds and kinds & {WINDOW, RECURRENT}
    assert family.turn_start_id is not None and family.header_end_id is not None


def test_cached_runs_are_bit_identical_to_cold_runs(family: LoadedModel) -> None:
    engine = Engine(family)
    reused = []
    for r in conversation():
        warm = engine.run(r, use_cache=True)
        cold = engine.run(r, use_cache=False)
        assert warm.token_ids == cold.token_ids
        assert diff(warm, cold) == 0.0, (r, warm.cached_tokens)
        assert warm.tokens == cold.tokens
        reused.append((warm.cached_tokens, len(warm.token_ids or ())))
    # the growing chat resumes at the whole previous prompt; a repeat at the generation
    # prompt's turn start; a new user turn after the shared system prompt at that turn's start
    (r0, n0), (r1, n1), (r2, _), (r3, _), (r4, _), (r5, _) = reused
    assert r0 == 0 and r1 == n0 and r2 == generation_start(family, engine, conversation()[2])
    assert 0 < r3 < n0 and 0 < r4 < n1 and 0 < r5 < n0
    assert engine.stats.snapshot_hits == 5 and engine.stats.snapshots_stored > 0


def test_resume_points_are_boundaries_the_first_prompt_passed(family: LoadedModel) -> None:
    engine = Engine(family)
    first, *_rest = conversation()
    new_turn = conversation()[3]
    a = engine.run(first, use_cache=True)
    b = engine.run(new_turn, use_cache=True)
    ids_a, ids_b = a.token_ids or (), b.token_ids or ()
    shared = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y)
    marks = boundaries(
        ids_a,
        a.image_spans or (),
        family.turn_start_id,
        family.header_end_id,
        reply_header=family.reply_header,
    )
    assert b.cached_tokens == max(p for p in marks if p <= shared)
    assert b.cached_tokens < shared  # the token oracle would say more: no snapshot there


def test_snapshots_are_namespaced(family: LoadedModel) -> None:
    engine = Engine(family)
    r = conversation()[0]
    engine.run(r, use_cache=True)
    other = Request(r.messages, namespace="tenant-b", max_new_tokens=r.max_new_tokens)
    assert engine.run(other, use_cache=True).cached_tokens == 0
    again = engine.run(r, use_cache=True)  # positive control: the same tenant hits
    assert again.cached_tokens == generation_start(family, engine, r)


def test_snapshots_count_in_the_budget_and_are_evicted(family: LoadedModel) -> None:
    big = Engine(family)
    for r in conversation():
        big.run(r, use_cache=True)
    used = big.cache_usage()["resident_bytes"]
    small = Engine(family, max_bytes=used // 3)
    for r in conversation():
        warm = small.run(r, use_cache=True)
        cold = small.run(r, use_cache=False)
        assert diff(warm, cold) == 0.0
        assert small.cache_usage()["resident_bytes"] <= used // 3
    assert small.stats.evictions > 0


def test_the_cut_schedule_is_what_makes_the_hybrid_exact() -> None:
    """Negative control: mlx-vlm 0.7.10's qwen3_5, with its own kernel choice (the chunked
    scan for every multi-token piece), gives different last logits for a prefill split at
    another position (NOTES.md), so a warm run that resumed at a snapshot taken with other cuts
    than the cold run's would not be bit-exact. The engine's own kernels per piece
    (``recurrent.py``: the sequential recurrence, a scan padding each call to a multiple of 8)
    are not split-invariant by design either; with the same cuts they repeat their arithmetic."""
    model = load_model(fixture_model("tiny-qwen3.5-vl"))
    text = Request((SYSTEM, user("Some words to prefill, long enough to split twice.")))
    ids = Engine(model).render(text, {}, use_cache=False).token_ids
    pos, _ = model.positions(ids, [])
    embeds = model.embed(ids)

    def last(cuts: list[int]) -> np.ndarray:
        return np.array(model.forward(ids, embeds, model.make_cache(), pos, cuts=cuts))

    assert model.piece_kernels and 2 < len(ids)
    model.piece_kernels = False  # mlx-vlm's own choice: the chunked scan
    one, split, again = last([]), last([len(ids) // 2]), last([len(ids) // 2])
    assert np.array_equal(split, again)  # same cuts: same arithmetic
    assert not np.array_equal(one, split)
    model.piece_kernels = True  # the engine's kernels: the same cuts, the same arithmetic
    assert np.array_equal(last([len(ids) // 2]), last([len(ids) // 2]))


def test_the_template_image_marker_expands_per_family(family: LoadedModel) -> None:
    engine = Engine(family)
    out = engine.run(req(SYSTEM, user("Look:", img(4), "and", img(5))), use_cache=False)
    spans = out.image_spans or ()
    assert [e - s for s, e, _ in spans] == [16, 16]  # a 64x64 image on both fixtures
    ids = out.token_ids or ()
    assert all(ids[s - 1] != family.image_token_id != ids[e] for s, e, _ in spans)


@pytest.mark.parametrize("name", ["tiny-qwen2-vl", *PARAMS])
def test_the_engine_renders_what_mlx_vlms_processor_renders(name: str) -> None:
    """The engine's token ids and image spans equal those of mlx-vlm's own processor (what
    mlx_vlm.server feeds its model; the HTTP adapter's ``VlmRenderer``), on every family:
    Gemma's ``<start_of_image>`` expanded around its soft tokens, its ``image_token_index``."""
    from pytest_prefixcache.adapters.http.render import VlmRenderer

    renderer = VlmRenderer(fixture_model(name))
    engine = Engine.from_pretrained(fixture_model(name))
    for r in conversation():
        ids, spans = renderer(r)
        out = engine.run(r, use_cache=False)
        assert (tuple(ids), tuple(spans)) == (out.token_ids, out.image_spans)


def test_a_prompt_ending_a_turn_is_resumed_whole(family: LoadedModel) -> None:
    """A prompt that ends with an assistant message (no generation prompt) is snapshotted at
    its end; the next prompt, which starts a turn there, resumes at all of it."""
    engine = Engine(family)
    u1 = user("Describe this picture, please, in a few words.", img(1))
    a1 = assistant("It is a square of colourful noise, nothing more.")
    first = engine.run(req(SYSTEM, u1, a1), use_cache=True)
    r = req(SYSTEM, u1, a1, user("And now?"))
    warm = engine.run(r, use_cache=True)
    assert warm.cached_tokens == len(first.token_ids or ())
    assert diff(warm, engine.run(r, use_cache=False)) == 0.0


class _ComputesAgain(Engine):
    """Negative control: render forgets the boundaries it found, so admission and the prefill
    each look for them again (three times a request), and every key hashes the root anew."""

    def render(self, *args: Any, **kwargs: Any) -> Any:
        return dataclasses.replace(super().render(*args, **kwargs), boundaries=None)

    def root(self, namespace: str, adapter: str | None = None) -> bytes:
        return engine_module.namespace_root(self.model.fingerprint, namespace)


@pytest.mark.parametrize("cls, per_request", [(Engine, 1), (_ComputesAgain, 3)])
def test_the_request_path_computes_each_thing_once(
    family: LoadedModel, monkeypatch: pytest.MonkeyPatch, cls: type[Engine], per_request: int
) -> None:
    """A cached request finds its prompt's boundaries once (admission and the prefill's cuts
    share them) and a namespace's root key is hashed once per engine (the block keys, the
    snapshot keys and the output keys share it)."""
    calls = {"boundaries": 0, "roots": 0}

    def counted(name: str, f: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return f(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(resume, "boundaries", counted("boundaries", resume.boundaries))
    monkeypatch.setattr(engine_module, "namespace_root", counted("roots", namespace_root))
    engine = cls(family, cache_output=True)
    first, grown = conversation()[:2]
    for r in (first, grown):
        engine.run(r, use_cache=True)
    assert engine.stats.snapshot_hits == 1  # the second request resumed at a snapshot
    assert calls["boundaries"] == 2 * per_request
    assert (calls["roots"] == 1) is (cls is Engine), calls["roots"]
