"""Row labels on mlx-lm's first BatchGenerator (0.30.x to 0.31.1, tap/identity_lm030.py): its
classes stood in for, as read in the 0.31.1 wheel. The prompts of ``_process_prompts`` are
labelled with their uids (the ``_step`` sampling their first tokens too), the decode ``_step``
with ``active_batch``'s uids in row order (after a filter), and the ``insert`` that follows the
HTTP request's tokenization admits the reply's id. Without these hooks (the negative control)
no row of that version is labelled and every reply of a wave is inferred."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import pytest

from pytest_prefixcache.tap import identity


class _Batch:
    def __init__(self, uids: list[int]) -> None:
        self.uids = uids


def _modules(seen: list[list[str] | None]) -> tuple[types.ModuleType, types.ModuleType]:
    class Generator:
        def __init__(self) -> None:
            self.count, self.unprocessed, self.active_batch = 0, [], None

        def insert(self, prompts: Any, max_tokens: Any = None, caches: Any = None) -> list[int]:
            uids = []
            for p in prompts:
                self.unprocessed.append((self.count, p))
                uids.append(self.count)
                self.count += 1
            return uids

        def _process_prompts(self, prompts: Any) -> _Batch:
            seen.append(identity.current_labels())  # the prefill's forward call
            self._step(None, None)  # the first tokens
            return _Batch([p[0] for p in prompts])

        def _step(self, input_tokens: Any, prompt_cache: Any) -> None:
            seen.append(identity.current_labels())

        def _next(self) -> None:
            if self.unprocessed:
                batch = self._process_prompts(self.unprocessed)
                self.unprocessed = []
                if self.active_batch is None:
                    self.active_batch = batch
                else:
                    self.active_batch.uids.extend(batch.uids)
            self._step(None, None)

    class Handler:
        def __init__(self, reply_id: str) -> None:
            self.request_id = reply_id

        def handle_completion(self, request: Any, stop_words: Any) -> Any:
            responder._tokenize(None, request)  # 0.30's _tokenize(tokenizer, request)
            return gen.insert([[1, 2]])

    class Responder:
        def _tokenize(self, tokenizer: Any, request: Any) -> str:
            return "tokens"

    gen_mod = types.ModuleType("mlx_lm.generate")
    gen_mod.Batch = _Batch  # type: ignore[attr-defined]
    gen_mod.BatchGenerator = Generator  # type: ignore[attr-defined]
    srv_mod = types.ModuleType("mlx_lm.server")
    srv_mod.APIHandler = Handler  # type: ignore[attr-defined]
    srv_mod.ResponseGenerator = Responder  # type: ignore[attr-defined]
    gen, responder = Generator(), Responder()
    srv_mod.objects = (gen, Handler)  # type: ignore[attr-defined]
    return gen_mod, srv_mod


@pytest.mark.parametrize("hooks", ["installed", "absent"])
def test_the_first_batch_generator_labels_its_rows(
    monkeypatch: pytest.MonkeyPatch, hooks: str
) -> None:
    seen: list[list[str] | None] = []
    gen_mod, srv_mod = _modules(seen)
    gen, handler = srv_mod.objects  # type: ignore[attr-defined]
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # install adds an import hook
    monkeypatch.setitem(sys.modules, "mlx_lm.generate", gen_mod)
    monkeypatch.setitem(sys.modules, "mlx_lm.server", srv_mod)
    admitted: list[tuple[str, str]] = []

    class Sink:
        def admit(self, label: str, reply_id: str, scheduler: str) -> None:
            admitted.append((label, reply_id))

    if hooks == "installed":
        done = identity.install(Sink())
        assert "mlx_lm.generate:BatchGenerator._process_prompts" in done
        assert "mlx_lm.generate:BatchGenerator.insert" in done
    handler("chatcmpl-a").handle_completion(object(), None)
    handler("chatcmpl-b").handle_completion(object(), None)
    gen._next()  # both prefilled together, their first tokens, one decode step
    handler("chatcmpl-c").handle_completion(object(), None)
    gen.active_batch.uids = [1]  # uid 0 finished and was filtered out
    gen._next()  # c prefilled alone, then joins: the decode step runs uids 1 and 2
    if hooks == "absent":
        assert admitted == [] and seen == [None] * 6
        return
    serial = gen._prefixcache_serial
    a, b, c = (f"{os.getpid()}:{serial}:{u}" for u in range(3))
    assert admitted == [(a, "chatcmpl-a"), (b, "chatcmpl-b"), (c, "chatcmpl-c")]
    assert seen == [[a, b], [a, b], [a, b], [c], [c], [b, c]]
    assert identity.current_labels() is None


def test_the_hooks_leave_a_later_batch_generator_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0.31.2 on has PromptProcessingBatch: its own hooks (identity.py), none of these
    seen: list[list[str] | None] = []
    gen_mod, srv_mod = _modules(seen)
    gen_mod.PromptProcessingBatch = _Batch  # type: ignore[attr-defined]
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setitem(sys.modules, "mlx_lm.generate", gen_mod)
    monkeypatch.setitem(sys.modules, "mlx_lm.server", srv_mod)

    class Sink:
        def admit(self, label: str, reply_id: str, scheduler: str) -> None:
            pass

    done = identity.install(Sink())
    assert not any("_process_prompts" in d or d.endswith(".insert") for d in done)
