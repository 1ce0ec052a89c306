"""A fake engine whose cache keeps state snapshots, as a cache for a hybrid (recurrent) or a
sliding-window model must: a state cannot be trimmed, so the engine resumes only at a prefix
whose state it stored while prefilling an earlier prompt. Same "model" as ``fakeengines``
(a running hash), whose module it imports: tests copy both into a pytester directory.

``snapshots`` says where it keeps them: ``"boundaries"`` (every message start, image edge and
prompt end it passes), ``"ends"`` (prompt ends only), ``"every"`` (every position: a cache
that reuses to the token) or ``"none"`` (a cache that never stores).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fakeengines import IM_START, FakeEngine, _h, render

from pytest_prefixcache import Outcome, Request


class SnapshotEngine:
    def __init__(
        self, snapshots: str = "boundaries", *, reference: str = "snapshot", starts: bool = True
    ) -> None:
        self.snapshots = snapshots
        self.reuse_reference = reference
        self.report_starts = starts
        self.model = FakeEngine()  # its state chain and logits, not its cache
        self.states: dict[bytes, bytes] = {}

    def reset(self) -> None:
        self.states.clear()

    def run(self, request: Request, *, use_cache: bool) -> Outcome:
        ids, spans = render(request)
        n = len(ids)
        starts = [i for i, t in enumerate(ids) if t == IM_START][:-1]  # not the generation prompt
        keys = [_h(b"prefix", request.namespace.encode())]
        for p, token in enumerate(ids):
            keys.append(_h(keys[-1], str(token).encode(), self.model._extras(p, spans)))
        state, cached = _h(b"ns", request.namespace.encode()), 0
        if use_cache:
            cached = next((p for p in range(n - 1, 0, -1) if keys[p] in self.states), 0)
            state = self.states.get(keys[cached], state)
        keep = {
            "boundaries": {n, *starts, *(e for s, t, _ in spans for e in (s, t))},
            "ends": {n},
            "every": set(range(n + 1)),
            "none": set(),
        }[self.snapshots]
        for pos in range(cached, n):
            state = self.model._advance(state, ids[pos], self.model._extras(pos, spans))
            if use_cache and pos + 1 in keep:
                self.states[keys[pos + 1]] = state
        logits = self.model._logits(state)
        tokens: list[int] = []
        steps = [logits]
        for _ in range(request.max_new_tokens):
            tokens.append(int(np.argmax(steps[-1])))
            state = self.model._advance(state, tokens[-1], b"")
            if len(tokens) < request.max_new_tokens:
                steps.append(self.model._logits(state))
        extra: dict[str, Any] = {"message_starts": tuple(starts)} if self.report_starts else {}
        return Outcome(
            logits=logits,
            step_logits=tuple(steps[: len(tokens)]),
            tokens=tuple(tokens),
            cached_tokens=cached,
            prompt_tokens=n,
            token_ids=tuple(ids),
            image_spans=tuple(spans),
            merges=tuple((e - max(s, cached),) * 2 for s, e, _ in spans if e > cached),
            **extra,
        )


def snapshot() -> SnapshotEngine:
    return SnapshotEngine()


def at_prompt_ends() -> SnapshotEngine:
    return SnapshotEngine("ends")


def at_prompt_ends_blind() -> SnapshotEngine:
    """Snapshots at prompt ends, and no message starts reported."""
    return SnapshotEngine("ends", starts=False)


def no_snapshots() -> SnapshotEngine:
    return SnapshotEngine("none")


def token_granular() -> SnapshotEngine:
    return SnapshotEngine("every", reference="token")


def snapshot_declared_token() -> SnapshotEngine:
    """A snapshot cache that does not say so: judged against the token oracle."""
    return SnapshotEngine(reference="token")
