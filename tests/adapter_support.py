"""Shared helpers for the adapter tests: requests, images, and the cached-vs-cold comparison."""

from __future__ import annotations

import importlib

import numpy as np

from pytest_prefixcache import Image, Message, Outcome, Request

SYSTEM = Message("system", ("You are a careful assistant. Describe images precisely.",))


def img(seed: int, w: int = 64, h: int = 64) -> Image:
    return Image(np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8))


def user(*parts: str | Image) -> Message:
    return Message("user", tuple(parts))


def assistant(text: str) -> Message:
    return Message("assistant", (text,))


def req(*messages: Message, max_new_tokens: int = 3, namespace: str = "") -> Request:
    return Request(tuple(messages), namespace=namespace, max_new_tokens=max_new_tokens)


def resolve(spec: str) -> object:
    """Build an engine from ``MODULE:ATTR``, as ``--prefixcache-engine`` names it."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)()


def worst_diff(cached: Outcome, cold: Outcome) -> float:
    """max |cached - cold| over the prompt logits and every shared decode step (inf if the
    tokens or shapes differ)."""
    if cached.tokens != cold.tokens:
        return float("inf")
    assert cached.logits is not None and cold.logits is not None
    pairs = [(cached.logits, cold.logits), *zip(cached.step_logits, cold.step_logits)]
    if any(a.shape != b.shape for a, b in pairs):
        return float("inf")
    return max(float(np.abs(a - b).max()) for a, b in pairs)


def top_diff(cached: Outcome, cold: Outcome) -> float:
    """max |cached - cold| over the token ids both top_logprobs maps report (inf if the top
    tokens differ)."""
    a, b = cached.top_logprobs or {}, cold.top_logprobs or {}
    if not a or not b or max(a, key=a.__getitem__) != max(b, key=b.__getitem__):
        return float("inf")
    shared = set(a) & set(b)
    return max(abs(a[t] - b[t]) for t in shared)
