"""Right-padded prefills through the tap: a row's padding is counted in the chunks that hold
it, not in every chunk of its prefill (tap/_labels.py ``padded_prefill``, ``take_padding``).

mlx-vlm 0.7's mixed warm/cold prefill right-pads each row's suffix to the longest and stops a
chunk where a short row's tokens end, keeping that chunk's logits as the row's first token's;
the cache's ``_right_padding`` is the row's padding over the whole prefill. Read from the
cache alone, the short row's last real chunk looked padded and no row of it ended at its
prompt length (the mlx_vlm.server waves' "no tap record ends at the prompt length 206").
The schedule below is the one the tap recorded there: a 206-token prompt with 192 reused
beside a cold 333-token one, chunks of 14, 318 and 1 columns."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from pytest_prefixcache.tap import TapReader, identity, identity_vlm
from pytest_prefixcache.tap._labels import take_padding
from pytest_prefixcache.tap.identity import _prompt_columns
from pytest_prefixcache.tap.tracks import TapLedger

VOCAB = 64


def _schedule(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    rotating: bool = False,
    early: bool = True,
    mixup: bool = False,
) -> tuple[TapLedger, list[str]]:
    """Stand-ins for mlx-vlm's batch classes on mlx-vlm's own ``BatchKVCache``, run through the
    real tap wrapper and the mlx-vlm hooks: the rows [warm 192 + 14, cold 333], one decode
    step after the first token, then one more for the long row. ``rotating``: Gemma 3's
    layout, a sliding-window ``BatchRotatingKVCache`` (32) before the full one (the tap reads
    the first); ``early=False``: mlx-vlm 0.7.0's chunks, which do not stop where a short row's
    tokens end (its first token then comes from a padding column: the -071 row's bug);
    ``mixup``: the server feeds each row the other row's first token (a mis-served row)."""
    mx = pytest.importorskip("mlx.core")
    cache_mod = pytest.importorskip("mlx_vlm.models.cache")
    from pytest_prefixcache.tap import wrap

    class Model:
        def __call__(self, inputs: Any, cache: Any = None, **kw: Any) -> Any:
            b, n = inputs.shape
            kv = mx.zeros((b, 1, n, 2))
            for layer in cache:
                layer.update_and_fetch(kv, kv)
            nxt = (inputs.astype(mx.int32) + 1) % VOCAB  # greedy: the input id + 1
            return (mx.arange(VOCAB)[None, None, :] == nxt[..., None]).astype(mx.float32)

    class Batch:  # PromptProcessingBatch, its mixed right-padded path
        def __init__(self, uids: list[int], prefixes: list[int], suffixes: list[list[int]]):
            width = max(map(len, suffixes))
            self.uids, self.model = uids, Model()
            self._suffix_lens = [len(s) for s in suffixes]
            self._right_pad_per_row = [width - len(s) for s in suffixes]
            self._processed_prompt_columns = 0
            self._ids = mx.array([s + [0] * (width - len(s)) for s in suffixes])
            self.prompt_cache = [cache_mod.BatchKVCache([0] * len(uids))]
            if rotating:
                self.prompt_cache.insert(0, cache_mod.BatchRotatingKVCache(32, [0] * len(uids)))
            for layer in self.prompt_cache:
                layer.offset = mx.array(prefixes)
                layer.prepare(right_padding=self._right_pad_per_row, lengths=self._suffix_lens)

        def prompt_step(self) -> int:
            done, width = self._processed_prompt_columns, self._ids.shape[1]
            n = width - done - 1
            if early:
                n = min([n] + [e - done for e in self._suffix_lens if e > done])
            self.model(self._ids[:, done : done + n], cache=self.prompt_cache)
            self._processed_prompt_columns += n
            return n

        def generate(self) -> Any:
            self.model(self._ids[:, self._processed_prompt_columns :], cache=self.prompt_cache)
            for layer in self.prompt_cache:
                layer.finalize()
            return Steps(self.uids, self.prompt_cache, self.model)

    class Steps:  # GenerationBatch
        def __init__(self, uids: list[int], cache: Any, model: Any) -> None:
            self.uids, self.prompt_cache, self.model = uids, cache, model

        def _step(self, tokens: list[int]) -> None:
            self.model(mx.array([[t] for t in tokens]), cache=self.prompt_cache)

    class Generator:  # BatchGenerator
        def insert(self, prompts: list[Any], **kw: Any) -> list[int]:
            return list(range(len(prompts)))

        def _next(self, prefixes: list[int], suffixes: list[list[int]]) -> None:
            batch = Batch(self.insert(suffixes), prefixes, suffixes)
            while batch._processed_prompt_columns < batch._ids.shape[1] - 1:
                batch.prompt_step()
            steps = batch.generate()
            first = [(s[-1] + 1) % VOCAB for s in suffixes]
            steps._step(first[::-1] if mixup else first)
            steps._step([(s[-1] + 2) % VOCAB for s in suffixes])

    ar = types.ModuleType("mlx_vlm.generate.ar")
    ar.PromptProcessingBatch = Batch  # type: ignore[attr-defined]
    ar.GenerationBatch = Steps  # type: ignore[attr-defined]
    ar.BatchGenerator = Generator  # type: ignore[attr-defined]
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setitem(sys.modules, "mlx_vlm.generate.ar", ar)
    for name in ("mlx_vlm.server.generation", "fastapi.applications"):  # nothing real patched
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    path = tmp_path / "tap.jsonl"
    sink = wrap._Sink(str(path))
    identity.install(sink, families=(identity_vlm.FAMILY,))
    wrap._wrap(Model, sink)
    gen = Generator()
    gen._next([192, 0], [[5] * 14, [7] * 333])
    labels = [f"{os.getpid()}:{gen._prefixcache_serial}:{u}" for u in (0, 1)]  # type: ignore[attr-defined]
    for label, reply in zip(labels, ("chatcmpl-warm", "chatcmpl-cold")):
        sink.admit(label, reply, "mlx_vlm.BatchGenerator")
    return TapLedger(TapReader(path)), labels


def test_a_warm_row_ending_in_an_early_chunk_answers_at_its_prompt_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, _ = _schedule(tmp_path, monkeypatch)
    warm = ledger.find(206, None, 3, reply_id="chatcmpl-warm")
    assert warm is not None and warm.attribution == "id" and not warm.note
    assert warm.reused == 192
    assert [(r.before, r.after) for r in warm.steps] == [(192, 206), (206, 207), (207, 208)]
    assert warm.greedy == (6, 7, 8)  # its first token from the chunk where its tokens end
    cold = ledger.find(333, None, 3, reply_id="chatcmpl-cold")
    assert cold is not None and cold.attribution == "id" and cold.reused == 0
    assert [(r.before, r.after) for r in cold.steps] == [(332, 333), (333, 334), (334, 335)]
    rows = [r for rec in ledger.records() for r in rec.rows if r.label == warm.track.label]
    # chunks of 14, 318 and 1: the 14 are real, the rest padding (318, then 1 already held)
    assert [(r.pad, r.held, r.real_after) for r in rows[:3]] == [(0, 0, 206), (318, 0, 206),
                                                                 (1, 318, 206)]  # fmt: skip


def test_negative_control_padding_read_from_the_cache_alone_loses_the_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the scheduler's columns (the tap before this fix), the short row's last real
    chunk reads as padded: no row of its request ends at 206, the wave's error."""
    monkeypatch.setattr(identity_vlm, "_columns", lambda *a, **k: None)
    ledger, _ = _schedule(tmp_path, monkeypatch)
    assert ledger.find(206, None, 3, reply_id="chatcmpl-warm") is None
    assert ledger.find(333, None, 3, reply_id="chatcmpl-cold") is not None


def test_mlx_lm_prompt_chunks_count_each_rows_padding_where_it_is() -> None:
    """mlx-lm's ``PromptProcessingBatch.prompt`` right-pads [10, 4] tokens to 10 and runs
    chunks of 3 (``--prefill-step-size 3``): the short row's 6 padding positions fall in the
    chunks after its 4th column, none before."""
    from pytest_prefixcache.tap._labels import local, padded_prefill

    said: list[Any] = []

    def prompt(self: Any, tokens: list[list[int]]) -> None:
        for n in (3, 3, 3, 1):
            said.append(take_padding(n, 2))

    padded_prefill(_prompt_columns)(prompt)(None, [[1] * 10, [1] * 4])
    assert said == [
        [(0, 0), (0, 0)],
        [(0, 0), (0, 2)],
        [(0, 0), (2, 3)],
        [(0, 0), (5, 1)],
    ]
    assert getattr(local, "columns", None) is None  # nothing left for the next call
    # equal lengths need no padding: the cache's reading stands
    padded_prefill(_prompt_columns)(prompt)(None, [[1] * 4, [1] * 4])
    assert said[-1] is None


def _warm_rows(ledger: TapLedger, label: str) -> list[tuple[int, int, int, int]]:
    rows = [r for rec in ledger.records() for r in rec.rows if r.label == label]
    return [(r.before, r.after, r.pad, r.held) for r in rows]


def test_a_rotating_window_rolls_the_padding_out_the_row_stays_tied_by_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gemma 3 (issue #33's INCONCLUSIVE on mlx-vlm 0.7.1 and 0.7.10): the tap reads the
    sliding-window layer, whose ``_update_concat`` rolls a finished row's padding out of its
    offset before each chunk. The padding the scheduler's columns say the row held is not in
    that offset: counted again, the row seemed to restart 318 positions back, its own label
    contradicted its track and the reply's rows were a guess cut after the first token."""
    ledger, labels = _schedule(tmp_path, monkeypatch, rotating=True)
    warm = ledger.find(206, None, 3, reply_id="chatcmpl-warm")
    assert warm is not None and warm.attribution == "id" and not warm.note
    assert [(r.before, r.after) for r in warm.steps] == [(192, 206), (206, 207), (207, 208)]
    assert warm.greedy == (6, 7, 8)
    # the 14 real tokens, then 318 and 1 of padding, each chunk starting at the real end
    assert _warm_rows(ledger, labels[0])[:3] == [(192, 206, 0, 0), (206, 524, 318, 0),
                                                 (206, 207, 1, 0)]  # fmt: skip
    cold = ledger.find(333, None, 3, reply_id="chatcmpl-cold")
    assert cold is not None and cold.attribution == "id" and cold.reused == 0


def test_negative_control_held_padding_counted_twice_puts_the_row_in_doubt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tap before this fix (held padding subtracted from a rotating layer's offset too):
    the reply is only ``guessed``, with one step, as in the -071 row's fixed side."""
    from pytest_prefixcache.tap import wrap

    monkeypatch.setattr(wrap, "_rolls_padding", lambda layer: False)
    ledger, _ = _schedule(tmp_path, monkeypatch, rotating=True)
    warm = ledger.find(206, None, 3, reply_id="chatcmpl-warm")
    assert warm is not None and warm.attribution == "guessed"
    assert "starts at KV offset" in warm.note and len(warm.steps) == 1


def test_negative_control_a_first_token_from_padding_is_still_an_engine_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mlx-vlm 0.7.0's chunks (no stop where the short row's tokens end), on the rotating
    layout: no row of the warm request ends at its prompt length, and the tap names the call
    that fed it only padding (the -071 row's buggy side)."""
    ledger, _ = _schedule(tmp_path, monkeypatch, rotating=True, early=False)
    assert ledger.find(206, None, 3, reply_id="chatcmpl-warm") is None
    assert "fed it only padding" in ledger.explain(206, "chatcmpl-warm")


def test_negative_control_a_mis_served_row_shows_in_its_steps_by_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that feeds the warm row the cold row's first token: the row is still tied by
    id, and its second step's logits are those of the token it was fed (9, not 7): the wave
    check compares them with the request served alone and fails on evidence, not on a guess."""
    ledger, _ = _schedule(tmp_path, monkeypatch, rotating=True, mixup=True)
    warm = ledger.find(206, None, 3, reply_id="chatcmpl-warm")
    assert warm is not None and warm.attribution == "id"
    assert warm.greedy == (6, 9, 8)


def test_only_a_rotating_batch_cache_mid_right_padded_prefill_rolls_its_padding() -> None:
    """``wrap._rolls_padding`` on mlx-vlm's own classes: a ``BatchRotatingKVCache`` with right
    padding declared (``_lengths``) rolls; the same without it, a ``BatchKVCache`` (it keeps
    its padding until ``finalize``) and another cache that keeps a ``_lengths`` do not."""
    pytest.importorskip("mlx.core")
    cache_mod = pytest.importorskip("mlx_vlm.models.cache")
    from pytest_prefixcache.tap.wrap import _rolls_padding

    rotating, full = cache_mod.BatchRotatingKVCache(32, [0, 0]), cache_mod.BatchKVCache([0, 0])
    assert not _rolls_padding(rotating) and not _rolls_padding(full)
    for layer in (rotating, full):
        layer.prepare(right_padding=[0, 3], lengths=[5, 2])
    assert _rolls_padding(rotating) and not _rolls_padding(full)

    class Pooled:  # e.g. mlx-vlm's BatchPoolingCache, whose _lengths is set from the start
        offset, _lengths = 0, [2**31, 2**31]

    assert not _rolls_padding(Pooled())


@pytest.mark.slow
def test_the_071_wave_on_the_real_server_is_attributed_by_id(tmp_path: Path) -> None:
    """The public record's -071 stream (2 waves of 4 on tiny-gemma3, a warm row finishing in an
    early chunk of a right-padded prefill) replayed on this environment's mlx_vlm.server under
    the tap: every request tied by id and the verdict a PASS (the tap before the fix guessed 2
    of the 8 and read the run INCONCLUSIVE)."""
    pytest.importorskip("mlx_vlm")
    import json
    import subprocess

    root = Path(__file__).resolve().parents[1]
    stream = root / "engines/history/counterexamples/mlx-vlm-071-right-padded-first-token-buggy"
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(root), "PREFIXCACHE_CONCURRENCY": "4",
           "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "-q",
         "-k", "test_replay", "--prefixcache-verify", "--pyargs", "pytest_prefixcache.suite",
         "--prefixcache-engine=pytest_prefixcache.adapters.presets:mlx_vlm_server",
         f"--prefixcache-model={root / 'fixtures' / 'tiny-gemma3'}", "--prefixcache-seed=1",
         f"--prefixcache-replay={stream / 'stream.json'}", f"--prefixcache-report={report}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert report.is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    got = json.loads(report.read_text())
    assert got["coverage"]["tap attribution by id"] == {"applied": 8}, got["coverage"]
    assert got["verdict"] == "pass", got.get("finding_examples")
