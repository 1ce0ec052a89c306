"""The bug zoo, mutant by mutant: a targeted scenario on which the bug shows (wrong logits,
slots != rows, reuse above the honest maximum, no reuse, a budget overrun, a slow hit), and
the unmodified engine on the same scenario as the negative control.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from pytest_prefixcache import Image, Message, Outcome, Request  # noqa: E402
from pytest_prefixcache.checks.oracle import ReuseOracle  # noqa: E402
from pytest_prefixcache.images import make_image  # noqa: E402
from reference_engine import Engine  # noqa: E402
from reference_engine.model import LoadedModel  # noqa: E402
from reference_engine.mutants import MUTANTS, Mutant  # noqa: E402
from reference_engine.mutants.keys import xor_fold_digest  # noqa: E402
from reference_engine.mutants.prompts import billing_header  # noqa: E402

BS = 16


def build(model: LoadedModel, name: str | None, **kw: Any) -> Engine:
    """The named mutant (None: the unmodified engine) on the shared model."""
    opts = {"block_size": BS, **(MUTANTS[name].options if name else {}), **kw}
    return Engine(model, **opts) if name is None else MUTANTS[name].build(model, **opts)


def img(seed: int, w: int = 64, h: int = 64) -> Image:
    rng = np.random.default_rng(seed)
    return Image(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))


def user(*parts: str | Image) -> Message:
    return Message("user", tuple(parts))


def assistant(text: str) -> Message:
    return Message("assistant", (text,))


def req(*messages: Message, max_new_tokens: int = 3, namespace: str = "") -> Request:
    return Request(tuple(messages), namespace=namespace, max_new_tokens=max_new_tokens)


SYS_TEXT = "You are a careful assistant. Describe images precisely and never invent details."
SYSTEM = Message("system", (SYS_TEXT,))
LONG = "Then list every object you see in detail, with its colour, its size and its place."
I1, I2, I3 = img(1), img(2), img(3)


def problems(engine: Engine, history: list[Request], final: Request) -> tuple[list[str], Outcome]:
    """Run the history cached, then ``final`` cached and cold; return what is wrong."""
    engine.reset()
    oracle = ReuseOracle()
    for i, r in enumerate(history):
        o = engine.run(r, use_cache=True)
        oracle.add(i, r.namespace, o.token_ids or (), o.image_spans or ())
    warm = engine.run(final, use_cache=True)
    cold = engine.run(final, use_cache=False)
    out: list[str] = []
    assert warm.logits is not None and cold.logits is not None
    diff = float(np.max(np.abs(warm.logits - cold.logits)))
    if diff != 0.0:
        out.append(f"logits differ by {diff:.3g}")
    steps = [
        i
        for i, (a, b) in enumerate(zip(warm.step_logits, cold.step_logits))
        if not np.array_equal(a, b)
    ]
    if steps or warm.tokens != cold.tokens:
        out.append(f"decode differs at steps {steps}: {warm.tokens} vs {cold.tokens}")
    out += [f"merge filled {s} slots with {r} rows" for s, r in warm.merges or () if s != r]
    match = oracle.match(final.namespace, warm.token_ids or (), warm.image_spans or ())
    if (warm.cached_tokens or 0) > match.max_reuse:
        out.append(f"cached_tokens={warm.cached_tokens} > honest maximum {match.max_reuse}")
    return out, warm


# name -> (history, final, what the problem list must mention)
WRONG_ANSWER: dict[str, tuple[list[Request], Request, str]] = {
    "placeholder_collision": (
        [req(SYSTEM, user("What is this?", I1, "Answer briefly."))],
        req(SYSTEM, user("What is this?", I2, "Answer briefly.")),
        "logits differ",
    ),
    "partial_image_merge": (
        [req(SYSTEM, user("Two pictures:", I1, I3), max_new_tokens=0)],
        req(SYSTEM, user("Two pictures:", I1, I2)),
        "slots with",
    ),
    "weak_image_hash": (
        [req(SYSTEM, user("What is this?", make_image("solid", 64, 64, seed=1)))],
        req(SYSTEM, user("What is this?", make_image("solid", 64, 64, seed=2))),
        "logits differ",
    ),
    "image_order_ignored": (
        [req(SYSTEM, user("Compare", I1, "with", I2))],
        req(SYSTEM, user("Compare", I2, "with", I1)),
        "logits differ",
    ),
    "unchained_blocks": (
        [req(SYSTEM, user("Look:", I1, LONG)), req(SYSTEM, user("Look:", I2, LONG))],
        req(SYSTEM, user("Look:", I2, LONG)),
        "logits differ",
    ),
    "snapshot_before_prefill": (
        [req(SYSTEM, user("What is in this picture?", I1))],
        req(SYSTEM, user("What is in this picture?", I1)),
        "logits differ",
    ),
    "snapshot_after_decode": (
        [req(SYSTEM, user("What is in this picture?", I1))],
        req(SYSTEM, user("What is in this picture?", I1)),
        "logits differ",
    ),
    "empty_suffix_refeed": (
        [req(SYSTEM, user("What is in this picture?", I1))],
        req(SYSTEM, user("What is in this picture?", I1)),
        "logits differ",
    ),
    "aliased_live_cache": (
        [
            req(SYSTEM, user("First question. " + LONG)),
            req(SYSTEM, user("Other question. " + LONG)),
        ],
        req(SYSTEM, user("First question. " + LONG)),
        "logits differ",
    ),
    "wrong_batch_row": (
        [
            req(SYSTEM, user("First question. " + LONG)),
            req(SYSTEM, user("Other question. " + LONG)),
        ],
        req(SYSTEM, user("Other question. " + LONG)),
        "logits differ",
    ),
    "namespace_missing": (
        [req(SYSTEM, user("Shared prompt text that fills more than one block of tokens.", I1))],
        req(
            SYSTEM,
            user("Shared prompt text that fills more than one block of tokens.", I1),
            namespace="tenant-b",
        ),
        "honest maximum",
    ),
    "mrope_restart": (
        [req(SYSTEM, user("Look at this.", I1, "Describe it."))],
        req(
            SYSTEM, user("Look at this.", I1, "Describe it."), assistant("A square."), user("Why?")
        ),
        "logits differ",
    ),
    "evicts_in_use": (  # B outgrows the small pool while it holds A's blocks
        [
            req(SYSTEM, user("First question. " + LONG)),
            req(
                SYSTEM,
                user("First question. " + LONG),
                assistant("Sure."),
                user(" ".join([LONG] * 4)),
            ),
        ],
        req(SYSTEM, user("First question. " + LONG)),
        "logits differ",
    ),
    "lying_hit_count": (
        [req(SYSTEM, user("What is this?", I1))],
        req(user("A new conversation about the same image:", I1)),
        "honest maximum",
    ),
}


@pytest.mark.parametrize("name", sorted(WRONG_ANSWER))
def test_mutant_shows_its_bug_and_the_engine_does_not(model: LoadedModel, name: str) -> None:
    history, final, symptom = WRONG_ANSWER[name]
    found, warm = problems(build(model, name), history, final)
    assert any(symptom in p for p in found), (name, found, warm)
    clean, ref = problems(build(model, None, **MUTANTS[name].options), history, final)
    assert clean == [], (name, clean)
    if name not in ("namespace_missing", "lying_hit_count"):  # these must not hit at all
        assert ref.cached_tokens, f"{name}: the scenario must exercise a cache hit"


def test_partial_image_crash_raises_the_shape_mismatch(model: LoadedModel) -> None:
    history, final, _ = WRONG_ANSWER["partial_image_merge"]
    engine = build(model, "partial_image_crash")
    engine.reset()
    for r in history:
        engine.run(r, use_cache=True)
    with pytest.raises(ValueError, match="shape mismatch"):
        engine.run(final, use_cache=True)
    assert engine.run(final, use_cache=False).merges == ((16, 16), (16, 16))


def test_weak_image_hash_collides_for_distinct_images() -> None:
    a, b = make_image("solid", 64, 64, seed=1), make_image("solid", 64, 64, seed=2)
    assert a != b and xor_fold_digest(a.pixels) == xor_fold_digest(b.pixels)
    flat = np.arange(32 * 64 * 3, dtype=np.uint8).reshape(32, 64, 3)
    assert xor_fold_digest(flat) == xor_fold_digest(flat.reshape(64, 32, 3))  # shape-blind


def _rendered_ids(engine: Engine, r: Request) -> tuple[int, ...]:
    return engine.run(r, use_cache=False).token_ids or ()


def test_volatile_header_kept_reuses_nothing(model: LoadedModel) -> None:
    def with_header(nonce: str) -> Request:
        sys = Message("system", (billing_header(nonce) + SYS_TEXT + " " + LONG,))
        return req(sys, user("What is this?", I1))

    first, second = with_header("a1b2c"), with_header("f9e8d")
    got: dict[str | None, int] = {}
    for name, normalised in ((None, True), ("volatile_header_kept", False)):
        engine = build(model, name)
        found, warm = problems(engine, [first], second)
        assert found == []
        a, b = _rendered_ids(engine, first), _rendered_ids(engine, second)
        assert (a == b) is normalised  # the normalised prompts are identical token for token
        # nothing after the nonce can be reused: it sits in the system prompt's first line
        nonce_at = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) if a != b else len(a)
        assert (warm.cached_tokens or 0) <= nonce_at
        got[name] = warm.cached_tokens or 0
    assert got[None] >= len(_rendered_ids(build(model, None), second)) - BS
    assert got["volatile_header_kept"] < 64 <= got[None] - got["volatile_header_kept"]


def test_history_rerendered_breaks_render_stability(model: LoadedModel) -> None:
    first = req(SYSTEM, user("Look:", I1), assistant("A noisy square."), user(LONG))
    second = req(*first.messages, assistant("Red, green and blue."), user("Thanks."))
    got: dict[str | None, int] = {}
    for name in (None, "history_rerendered"):
        engine = build(model, name)
        found, warm = problems(engine, [first], second)
        assert found == []
        a, b = _rendered_ids(engine, first), _rendered_ids(engine, second)
        # an append-only next turn must render the previous request as a prefix
        assert (b[: len(a)] == a) is (name is None)
        got[name] = warm.cached_tokens or 0
    assert got[None] >= len(_rendered_ids(build(model, None), first)) - BS
    assert got["history_rerendered"] < got[None] - BS


def _pool_bytes(engine: Engine) -> int:
    """Bytes of KV the pool's blocks keep alive (each segment once, however many windows)."""
    segments = {id(b.payload.segment): b.payload.segment for b in engine.pool.blocks()}
    return sum(s.nbytes for s in segments.values())


def test_zero_byte_accounting_overruns_the_budget(model: LoadedModel) -> None:
    budget = 40_000
    text = " ".join(f"word{i}" for i in range(120))
    stream = [req(SYSTEM, user(f"{k}: {text}", img(k))) for k in range(3)]
    for name, within in ((None, True), ("zero_byte_accounting", False)):
        engine = build(model, name, max_bytes=budget)
        engine.reset()
        for r in stream:
            engine.run(r, use_cache=True)
        assert (_pool_bytes(engine) <= budget) is within, (name, _pool_bytes(engine))
    assert engine.stats.resident_bytes == 0 and engine.stats.evictions == 0


def test_slow_restore_computes_more_on_a_hit_than_no_cache(
    model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hit on slow_restore costs more prefill work than no cache; the unmodified engine's
    hit costs less. Work, counted as the prompt tokens each serve computes (past its reused
    prefix), not wall time: the time is judged by ``--prefixcache-min-speedup`` in the mutant
    detection runs (marked ``timing``)."""
    computed: list[int] = []
    serve = Engine._serve

    def counting(self: Engine, request: Request, rendered: Any, *args: Any, **kw: Any) -> Any:
        reuse = args[2] if len(args) > 2 else kw["reuse"]
        computed.append(len(rendered.token_ids) - reuse.tokens)
        return serve(self, request, rendered, *args, **kw)

    monkeypatch.setattr(Engine, "_serve", counting)
    r = req(SYSTEM, user("What is this?", I1, LONG + " " + LONG), max_new_tokens=0)
    for name, cheaper in ((None, True), ("slow_restore", False)):
        engine = build(model, name)
        engine.reset()
        engine.run(r, use_cache=True)
        computed.clear()
        out = engine.run(r, use_cache=True)
        warm = sum(computed)
        computed.clear()
        engine.run(r, use_cache=False)
        cold = sum(computed)
        assert out.cached_tokens and out.cached_tokens > 100
        assert (warm < cold) is cheaper, (name, warm, cold)


def test_never_stores_reuses_nothing_on_an_exact_repeat(model: LoadedModel) -> None:
    r = req(SYSTEM, user("What is in this picture?", I1))
    for name, reused in ((None, True), ("never_stores", False)):
        found, warm = problems(build(model, name), [r], r)
        assert found == [] and bool(warm.cached_tokens) is reused


def test_registry() -> None:
    import reference_engine.mutants as zoo

    classes = {m.bug_class for m in MUTANTS.values()}
    assert {1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 20, 21, 22} <= classes
    assert len({m.engine_class for m in MUTANTS.values()}) == len(MUTANTS)
    for name, m in MUTANTS.items():
        assert isinstance(m, Mutant) and m.name == name
        assert issubclass(m.engine_class, Engine) and m.engine_class is not Engine
        assert "#" in m.source or "commit" in m.source or len(m.source) > 10, name
        assert m.engine_class.__doc__ and "Reproduces" in m.engine_class.__doc__
        factory = getattr(zoo, name)
        assert callable(factory) and factory.__name__ == name
    with pytest.raises(AttributeError, match="no mutant"):
        zoo.no_such_mutant  # noqa: B018
