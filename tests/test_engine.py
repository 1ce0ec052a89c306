"""The reference engine: cached runs are bit-identical to cold runs, and reuse is segmented.

Every scenario runs a history through the cache, then the final request cached and cold, and
asserts max |diff| == 0.0 for the logits of the last prompt position and every decode step,
and that the cached run reused exactly what the scenario allows (the reuse oracle's maximum).
The negative controls run the same scenarios on an engine whose block keys drop the image
digests, and assert that the comparison then fails.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from pytest_prefixcache import Image, Message, Outcome, Request  # noqa: E402
from pytest_prefixcache.checks.oracle import ReuseOracle  # noqa: E402
from reference_engine import Engine, default_model_path  # noqa: E402
from reference_engine import blocks as blocks_mod  # noqa: E402
from reference_engine import engine as engine_mod  # noqa: E402

BS = 16


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_pretrained(default_model_path(), block_size=BS)


def img(seed: int, w: int = 64, h: int = 64) -> Image:
    rng = np.random.default_rng(seed)
    return Image(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))


def user(*parts) -> Message:
    return Message("user", tuple(parts))


def assistant(text: str) -> Message:
    return Message("assistant", (text,))


SYSTEM = Message("system", ("You are a careful assistant. Describe images precisely.",))


def req(*messages: Message, max_new_tokens: int = 3, namespace: str = "") -> Request:
    return Request(tuple(messages), namespace=namespace, max_new_tokens=max_new_tokens)


def compare(engine: Engine, history: list[Request], final: Request) -> Outcome:
    """Run history cached, then final cached and cold; assert bit-identical results."""
    engine.reset()
    for r in history:
        engine.run(r, use_cache=True)
    warm = engine.run(final, use_cache=True)
    cold = engine.run(final, use_cache=False)
    assert warm.logits is not None and cold.logits is not None
    assert warm.logits.dtype == np.float32 and warm.logits.shape == cold.logits.shape
    diff = float(np.max(np.abs(warm.logits - cold.logits)))
    assert diff == 0.0, f"last-position logits differ: max |diff| = {diff}"
    assert warm.tokens == cold.tokens
    assert len(warm.step_logits) == len(cold.step_logits) == len(warm.tokens)
    for i, (a, b) in enumerate(zip(warm.step_logits, cold.step_logits)):
        assert np.array_equal(a, b), f"step {i} logits differ"
    for slots, rows in warm.merges or ():
        assert slots == rows
    assert cold.cached_tokens == 0
    return warm


I1, I2, I3 = img(1), img(2), img(3)

SCENARIOS: dict[str, tuple[list[Request], Request]] = {
    "exact_repeat": (
        [req(SYSTEM, user("What is in this picture?", I1))],
        req(SYSTEM, user("What is in this picture?", I1)),
    ),
    "multi_turn_extension": (
        [req(SYSTEM, user("Look at this.", I1, "Describe it."))],
        req(
            SYSTEM,
            user("Look at this.", I1, "Describe it."),
            assistant("A noisy square."),
            user("And the colours?"),
        ),
    ),
    "new_image_after_cached_text": (
        [req(SYSTEM, user("Here is some long text about the weather and the sea, to be cached."))],
        req(
            SYSTEM,
            user("Here is some long text about the weather and the sea, to be cached."),
            assistant("Noted."),
            user("Now this image:", I2),
        ),
    ),
    "same_image_in_later_turn": (
        [req(SYSTEM, user("First:", I1))],
        req(SYSTEM, user("First:", I1), assistant("Seen."), user("Again:", I1, "same?")),
    ),
    "two_images_swapped": (
        [req(SYSTEM, user("Compare", I1, "with", I2))],
        req(SYSTEM, user("Compare", I2, "with", I1)),
    ),
    "different_image_same_size_same_slot": (
        [req(SYSTEM, user("What is this?", I1, "Answer briefly."))],
        req(SYSTEM, user("What is this?", I2, "Answer briefly.")),
    ),
    "different_image_size": (
        [req(SYSTEM, user("What is this?", img(4, 64, 64)))],
        req(SYSTEM, user("What is this?", img(4, 96, 48))),
    ),
    "boundary_inside_image_span": (
        # the history ends partway into the image span of the final request's first image
        [req(SYSTEM, user("Two pictures:", I1, I3), max_new_tokens=0)],
        req(SYSTEM, user("Two pictures:", I1, I2)),
    ),
}

IMAGE_SENSITIVE = [
    "two_images_swapped",
    "different_image_same_size_same_slot",
    "boundary_inside_image_span",
]


#: Where each scenario's reuse must stop, from the final request's outcome and the history
#: request's prompt: a correct cache with partial blocks reuses everything up to there.
EXPECTED_REUSE: dict[str, Callable[[Outcome, Outcome], int]] = {
    "exact_repeat": lambda warm, before: len(before.token_ids or ()) - 1,  # one token computed
    "multi_turn_extension": lambda warm, before: len(before.token_ids or ()),
    "new_image_after_cached_text": lambda warm, before: len(before.token_ids or ()),
    "same_image_in_later_turn": lambda warm, before: len(before.token_ids or ()),
    "two_images_swapped": lambda warm, before: (warm.image_spans or ())[0][0],
    "different_image_same_size_same_slot": lambda warm, before: (warm.image_spans or ())[0][0],
    "different_image_size": lambda warm, before: (warm.image_spans or ())[0][0],
    "boundary_inside_image_span": lambda warm, before: (warm.image_spans or ())[1][0],
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_cached_equals_cold(engine: Engine, name: str) -> None:
    history, final = SCENARIOS[name]
    warm = compare(engine, history, final)
    (earlier,) = history
    before = engine.run(earlier, use_cache=False)  # its prompt, without touching the cache
    expected = EXPECTED_REUSE[name](warm, before)
    assert expected > 0
    assert warm.cached_tokens == expected
    oracle = ReuseOracle()  # the plugin's reuse oracle agrees that this is the most reusable
    oracle.add(0, earlier.namespace, before.token_ids or (), before.image_spans or ())
    match = oracle.match(final.namespace, warm.token_ids or (), warm.image_spans or ())
    assert match.max_reuse == expected


def test_exact_repeat_recomputes_only_the_last_token(engine: Engine) -> None:
    history, final = SCENARIOS["exact_repeat"]
    warm = compare(engine, history, final)
    assert warm.prompt_tokens is not None and warm.cached_tokens is not None
    assert warm.prompt_tokens % BS != 0  # the reuse ends inside the stored partial tail
    assert warm.prompt_tokens - warm.cached_tokens == 1


def test_boundary_inside_image_span_merges_exact_rows(engine: Engine) -> None:
    """A pool that holds only the first 4 blocks (64 tokens): the reuse ends there, inside
    image 1's placeholders (52-68), which token-granular lookup would otherwise go past."""
    history, final = SCENARIOS["boundary_inside_image_span"]
    compare(engine, history, final)
    per_block = max(b.nbytes for b in engine.pool.blocks())
    small = Engine(engine.model, block_size=BS, max_bytes=4 * per_block)
    warm = compare(small, history, final)
    spans = warm.image_spans
    assert spans is not None and warm.cached_tokens is not None
    first = spans[0]
    # the test is meaningful only if the reuse boundary really falls inside image 1's span
    assert first[0] < warm.cached_tokens < first[1], (warm.cached_tokens, spans)
    assert warm.merges is not None
    assert warm.merges[0] == (first[1] - warm.cached_tokens,) * 2
    assert all(s == r for s, r in warm.merges)


def test_eviction_under_tiny_budget_stays_exact() -> None:
    engine = Engine.from_pretrained(default_model_path(), block_size=BS, max_bytes=40_000)
    text = " ".join(f"word{i}" for i in range(120))
    history = [req(SYSTEM, user(f"{k}: {text}", img(k))) for k in range(3)]
    final = req(SYSTEM, user(f"0: {text}", img(0)))
    compare(engine, history, final)
    stats = engine.stats
    assert stats.evictions > 0
    assert stats.resident_bytes <= 40_000


def test_segmented_reuse_stops_at_the_changed_image(engine: Engine) -> None:
    a, b, c, d, e = (
        "Text A about a trip.",
        "Image one:",
        "Text C, more words here.",
        ("Text D follows with even more words to fill blocks."),
        "Image two:",
    )
    im1, im2, im2b = img(11), img(12, 80, 48), img(13, 80, 48)
    first = req(
        SYSTEM,
        user(a),
        assistant("ok"),
        user(b, im1),
        assistant("ok"),
        user(c),
        assistant("ok"),
        user(d),
        assistant("ok"),
        user(e, im2),
    )
    second = req(*first.messages[:-1], user(e, im2b))
    warm = compare(engine, [first], second)
    assert warm.image_spans is not None and warm.cached_tokens is not None
    image2_start = warm.image_spans[-1][0]
    assert image2_start % BS != 0  # the image starts inside a block: reuse stops mid-block
    assert warm.cached_tokens == image2_start
    # and image 1's placeholders were reused, not re-merged
    assert len(warm.merges or ()) == 1


def test_forced_hash_collision_never_returns_wrong_kv(engine, monkeypatch) -> None:
    monkeypatch.setattr(blocks_mod, "hash_block", lambda parent, tokens, extras: b"\0" * 32)
    for name in [*IMAGE_SENSITIVE, "multi_turn_extension"]:
        history, final = SCENARIOS[name]
        compare(engine, history, final)
    assert engine.pool.stats.collisions > 0


def _drop_image_digests(original: Callable) -> Callable:
    def keys(token_ids, spans, *, block_size, root):
        return original(token_ids, [], block_size=block_size, root=root)

    return keys


@pytest.mark.parametrize("name", IMAGE_SENSITIVE)
def test_negative_control_key_without_image_digest_fails(engine, monkeypatch, name) -> None:
    monkeypatch.setattr(engine_mod, "KeyChain", _drop_image_digests(blocks_mod.KeyChain))
    history, final = SCENARIOS[name]
    with pytest.raises(AssertionError, match="logits differ"):
        compare(engine, history, final)


def test_namespaces_never_share_blocks(engine: Engine) -> None:
    engine.reset()
    r = req(SYSTEM, user("Shared prompt text that fills more than one block of tokens.", I1))
    engine.run(r, use_cache=True)
    other = engine.run(Request(r.messages, namespace="tenant-b"), use_cache=True)
    same = engine.run(r, use_cache=True)
    assert other.cached_tokens == 0
    assert same.cached_tokens and same.cached_tokens > 0  # positive control


def test_namespaces_share_no_image_encoding_and_no_remembered_piece(engine: Engine) -> None:
    """Nor the caches beside the KV blocks: an image or a text another tenant sent must not be
    a faster hit (the isolation audit measured the shared piece cache: KS p=0.0006)."""
    engine.reset()
    assert engine.tokens is not None
    r = req(SYSTEM, user("A text only tenant A has sent so far.", I1))
    engine.run(r, use_cache=True)
    encoded, first = engine.stats.vision_encoded, engine.tokens.hits  # hits within one prompt
    engine.run(Request(r.messages, namespace="tenant-b"), use_cache=True)
    assert engine.stats.vision_encoded == encoded + 1  # tenant B's image is encoded again
    assert engine.tokens.hits == 2 * first  # and its text tokenised again, as A's first was
    engine.run(r, use_cache=True)  # positive control: tenant A's own repeat hits its pieces
    assert engine.tokens.hits > 3 * first
    engine.run(req(SYSTEM, user("Other words before the same image.", I1)), use_cache=True)
    assert engine.stats.vision_encoded == encoded + 1 and engine.stats.vision_hits == 1


def test_stats_and_reset(engine: Engine) -> None:
    engine.reset()
    r = req(SYSTEM, user("Count me.", I1))
    engine.run(r, use_cache=True)
    engine.run(r, use_cache=True)
    s = engine.stats
    assert s.requests == 2 and s.lookups == 2 and s.stored_blocks > 0
    assert s.hit_tokens > 0 and s.resident_bytes > 0 and s.vision_encoded == 1
    engine.reset()
    assert engine.stats.resident_blocks == 0 and engine.stats.requests == 0


def test_uncached_run_neither_reads_nor_writes(engine: Engine) -> None:
    engine.reset()
    r = req(SYSTEM, user("Nothing stored.", I1))
    out = engine.run(r, use_cache=False)
    assert out.cached_tokens == 0 and len(engine.pool) == 0 and len(engine.vision) == 0


def test_cold_run_equals_the_models_own_forward(engine: Engine) -> None:
    """The engine computes the real model: its uncached logits, at the prompt's end and at
    every decode step, equal mlx-vlm's own one-shot forward over the processor's inputs, on
    the model as ``mlx_vlm.load`` gives it (the engine's has its linear layers transposed)."""
    from mlx_vlm import load

    from reference_engine.render import to_chat_messages

    r = req(SYSTEM, user("Look", I1, "and", img(5, 96, 48), "now"), max_new_tokens=4)
    out = engine.run(r, use_cache=False)
    proc = engine.model.processor
    text = proc.apply_chat_template(to_chat_messages(r), tokenize=False, add_generation_prompt=True)
    inputs = proc(text=[text], images=[i.to_pil() for i in r.images], return_tensors="mlx")
    assert tuple(int(t) for t in np.array(inputs["input_ids"][0])) == out.token_ids
    full = mx.array([list(out.token_ids) + list(out.tokens[:-1])])
    untouched, _ = load(str(engine.model.path))  # load_model transposes the linear layers
    native = (
        untouched(
            full, pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"]
        )
        .logits[0]
        .astype(mx.float32)
    )
    n = len(out.token_ids)
    assert len(out.step_logits) == len(out.tokens) == 4
    for i, step in enumerate(out.step_logits):
        expected = np.array(native[n - 1 + i])
        diff = float(np.max(np.abs(expected - step)))
        assert diff == 0.0, f"step {i}: max |diff| vs native forward = {diff}"
    assert out.merges == ((16, 16), (18, 18))


@pytest.mark.parametrize("n", [1, 2, 256, 257, 300])
def test_forward_runs_the_last_position_alone(engine: Engine, monkeypatch, n: int) -> None:
    """Only the last position's logits are needed: ``forward`` runs it as a step of its own,
    after chunks of the other positions (whose logits, and last layer's attention and MLP, MLX
    then never computes), and gets the logits and KV rows of one call over the whole prompt
    into mlx-vlm's own KVCache (the engine's hands attention its keys transposed)."""
    from reference_engine.cpu import kv_cache_class

    model = engine.model
    lm = model.model.language_model
    ids = [int(t) for t in np.random.default_rng(n).integers(10, 400, size=n)]
    pos = mx.array(np.broadcast_to(np.arange(n, dtype=np.int32), (3, 1, n)).copy())
    embeds = model.embed(ids)
    whole = [kv_cache_class(transposed=False)() for _ in range(model.num_layers)]  # mlx-vlm's
    out = lm(mx.array([ids]), inputs_embeds=embeds[None], cache=whole, position_ids=pos)
    expected = np.array(out.logits[0, -1].astype(mx.float32))
    steps: list[int] = []
    call = type(lm).__call__

    def counted(self, inputs, **kwargs):
        steps.append(int(inputs.shape[1]))
        return call(self, inputs, **kwargs)

    monkeypatch.setattr(type(lm), "__call__", counted)
    cache = model.make_cache(n)
    logits = model.forward(ids, embeds, cache, pos, chunk=256)
    assert steps == [min(256, n - 1 - s) for s in range(0, n - 1, 256)] + [1]
    assert np.array_equal(np.array(logits), expected)
    for a, b in zip(whole, cache, strict=True):
        assert np.array_equal(np.array(a.keys[..., :n, :]), np.array(b.keys[..., :n, :]))
        assert np.array_equal(np.array(a.values[..., :n, :]), np.array(b.values[..., :n, :]))


def test_transposed_linears_equal_the_originals_bit_for_bit() -> None:
    """Every linear layer of the fixture's language model, weight stored transposed, gives
    the original layer's output bit for bit, with and without a bias, for 1 to 256 rows."""
    import mlx.nn as nn
    from mlx_vlm import load

    from reference_engine.cpu import TransposedLinear, transpose_linears

    model, _ = load(str(default_model_path()))
    lm = model.language_model
    linears = [m for _, m in lm.named_modules() if type(m) is nn.Linear]
    assert len(linears) == 2 * 7 + 1 and any("bias" in m for m in linears)
    for layer in linears:
        fast = TransposedLinear(layer)
        for rows in (1, 2, 17, 256):
            x = mx.random.normal((1, rows, layer.weight.shape[1]), key=mx.random.key(rows))
            assert np.array_equal(np.array(layer(x)), np.array(fast(x)))
    assert transpose_linears(lm) == len(linears)
    assert not any(type(m) is nn.Linear for _, m in lm.named_modules())


def test_concurrent_requests_equal_their_serial_cold_results(engine: Engine) -> None:
    """Four threads send interleaved requests that share prefixes and images; every result
    equals its cold result, and afterwards no block is still referenced."""
    import threading

    engine.reset()
    base = [SYSTEM, user("Shared opening text for every thread, long enough to fill blocks.")]
    requests = [
        req(*base, assistant("ok"), user(f"Thread {t} asks about", img(20 + t % 2), f"({k})"))
        for t in range(4)
        for k in range(3)
    ]
    cold = {i: engine.run(r, use_cache=False) for i, r in enumerate(requests)}
    results: dict[int, Outcome] = {}
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(t, len(requests), 4):
                results[i] = engine.run(requests[i], use_cache=True)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors and len(results) == len(requests)
    for i, out in results.items():
        assert out.logits is not None and cold[i].logits is not None
        assert np.array_equal(out.logits, cold[i].logits), f"request {i} differs from cold"
        assert out.tokens == cold[i].tokens
    assert sum(1 for o in results.values() if o.cached_tokens) >= len(requests) - 2
    assert all(b.refcount == 0 for b in engine.pool.blocks())


def test_keys_beyond_the_lookup_are_hashed_while_the_prefill_runs(engine, monkeypatch) -> None:
    """A miss at block 0 hashes one block before the prefill; the rest are hashed inside
    the first chunk's computation (``forward``'s ``meanwhile``), before store needs them."""
    hashed: list[str] = []
    real_hash, real_forward = blocks_mod.hash_block, engine.model.forward

    def forward(*args, meanwhile=None, **kwargs):
        hashed.append(f"forward with {len(hashed)} hashed")
        try:
            return real_forward(*args, meanwhile=meanwhile, **kwargs)
        finally:
            hashed.append("returned")

    monkeypatch.setattr(blocks_mod, "hash_block", lambda *a: hashed.append("h") or real_hash(*a))
    monkeypatch.setattr(engine.model, "forward", forward)
    engine.reset()
    out = engine.run(req(SYSTEM, user("Describe this.", img(3))))
    first = hashed.index(next(h for h in hashed if h.startswith("forward")))
    assert hashed[first] == "forward with 1 hashed"
    blocks = -(-out.prompt_tokens // BS)
    assert hashed[: hashed.index("returned")].count("h") == blocks  # all, within the prefill
    assert hashed.count("h") == blocks and engine.stats.stored_blocks == blocks


def test_a_prefill_override_without_the_hooks_still_stores(monkeypatch) -> None:
    """A subclass whose prefill calls the model's forward without ``at_last_chunk`` (as a
    user's engine might) still stores its blocks after the prefill, and the next request hits."""

    class PlainPrefill(Engine):
        def prefill(self, ids, start, embeds, cache, positions):  # type: ignore[override]
            self._meanwhile = self._at_last_chunk = None
            return self.model.forward(ids[start:], embeds, cache, positions[:, :, start:])

    engine = PlainPrefill.from_pretrained(default_model_path(), block_size=BS)
    first = req(SYSTEM, user("Describe this.", img(5)))
    second = req(SYSTEM, user("Describe this.", img(5)), assistant("ok"), user("More?"))
    warm = compare(engine, [first], second)
    assert warm.cached_tokens and warm.cached_tokens > BS


def test_prefill_gets_its_hooks_as_parameters(engine: Engine) -> None:
    """The engine hands prefill its two callbacks as arguments, not through fields: an
    override that takes them and passes them on still stores while prefill runs."""
    seen: dict[str, object] = {}

    class Spy(Engine):
        def prefill(self, ids, start, embeds, cache, positions, **hooks):  # type: ignore[override]
            seen.update(hooks)
            before = self.pool.stats.stored_blocks
            logits = super().prefill(ids, start, embeds, cache, positions, **hooks)
            seen["stored inside"] = self.pool.stats.stored_blocks - before
            return logits

    spy = Spy(engine.model, block_size=BS)
    spy.run(req(SYSTEM, user("Describe this.", img(3))))
    assert sorted(seen) == ["at_last_chunk", "meanwhile", "stored inside"]
    assert callable(seen["meanwhile"]) and callable(seen["at_last_chunk"])
    assert seen["stored inside"] == spy.stats.stored_blocks > 0
    assert not hasattr(spy, "_meanwhile") and not hasattr(spy, "_at_last_chunk")
    spy.run(req(SYSTEM, user("Describe this.", img(3))), use_cache=False)
    assert seen["at_last_chunk"] is None  # an uncached run stores nothing
