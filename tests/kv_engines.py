"""A toy engine with an exact prefix cache whose decode does, or does not, compute the KV of
its last generated token (tests/test_decode_kv.py). Self-contained (numpy and
pytest_prefixcache only): the plugin's tests copy it into a pytester directory."""

from __future__ import annotations

import hashlib

import numpy as np

from pytest_prefixcache import Outcome, Request
from pytest_prefixcache.checks import shared_prefix

VOCAB = 128
LETTERS = range(97, 123)  # replies are lowercase letters: a reply re-renders to its own ids


def render(request: Request) -> list[int]:
    ids: list[int] = []
    for m in request.messages:
        ids += [1, {"system": 2, "user": 3, "assistant": 4}[m.role]]
        ids += [b for part in m.content for b in str(part).encode()]
    return [*ids, 1, 4]


def logprobs(seq: list[int]) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(bytes(min(t, 255) for t in seq)).digest()[:8], "little")
    logits = np.random.default_rng(seed).standard_normal(VOCAB).astype(np.float32)
    logits[LETTERS.start : LETTERS.stop] += 8.0
    return (logits - np.log(np.sum(np.exp(logits.astype(np.float64))))).astype(np.float32)


class KvEngine:
    """A toy engine with an exact prefix cache: it keeps the prompt + output tokens whose KV its
    decode computed (all of them with ``last_kv``, else all but the last) and reuses the
    longest prefix a kept sequence shares. ``overclaim``: it reports reuse through its last
    output token as well, which it never computed (the bug the bound must catch)."""

    def __init__(
        self, *, last_kv: bool, declare: bool | None = None, overclaim: bool = False
    ) -> None:
        self.last_kv, self.overclaim = last_kv, overclaim
        self.kept: list[tuple[int, ...]] = []
        self.claimed: list[tuple[int, ...]] = []
        self.calls = 0
        if declare is not None:
            self.last_token_kv = declare
        self.decode_kv_probe = declare is None
        self.supports_images = False  # text only, one namespace
        self.supports_namespaces = False

    def reset(self) -> None:
        self.kept.clear()
        self.claimed.clear()

    def run(self, request: Request, *, use_cache: bool) -> Outcome:
        self.calls += 1
        ids = render(request)
        cap = len(ids) - 1
        kept = self.claimed if self.overclaim else self.kept
        reused = max((shared_prefix(ids, s) for s in kept), default=0) if use_cache else 0
        seq, steps, tokens = list(ids), [], []
        for _ in range(max(1, request.max_new_tokens)):
            lp = logprobs(seq)
            steps.append(lp)
            tokens.append(int(np.argmax(lp)))
            seq.append(tokens[-1])
        if use_cache:
            self.kept.append(tuple(seq if self.last_kv else seq[:-1]))
            self.claimed.append(tuple(seq))
        return Outcome(
            logits=steps[0],
            tokens=tuple(tokens),
            step_logits=tuple(steps),
            cached_tokens=min(reused, cap),
            prompt_tokens=len(ids),
            token_ids=tuple(ids),
            text="".join(chr(t) for t in tokens),
        )
