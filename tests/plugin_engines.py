"""Fake engines for the plugin's tests: a pure-numpy engine with a real block prefix cache,
and broken variants, one per bug class the plugin must catch.

The "model" is a running hash over (token, image digest, offset in the image) pairs seeded by
the namespace; the logits are a pseudo-random float32 vector seeded by that state. So the
logits depend on every token and every image, and a wrong reuse changes them. The cache
stores the state at the end of every full block under a chained key; a hit restores the
state and computes the rest. This file is self-contained (numpy and pytest_prefixcache only)
so tests can copy it into a pytester directory.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from pytest_prefixcache import Image, Outcome, Request

BLOCK = 8
VOCAB = 300
ROLE = {"system": 260, "user": 261, "assistant": 262}
IM_START, IM_END, V_START, V_END, PAD = 270, 271, 272, 273, 280
VOLATILE = re.compile(r"^x-anthropic-billing-header:[^\n]*\n?", re.M)


def placeholders(img: Image) -> int:
    w, h = img.size
    return math.ceil(w / 16) * math.ceil(h / 16)


def render(
    request: Request, rerender_history: bool = False, header: str = "", keep_volatile: bool = False
) -> tuple[list[int], list[tuple[int, int, str]]]:
    ids: list[int] = list(header.encode())
    spans: list[tuple[int, int, str]] = []
    last_reply = max(
        (i for i, m in enumerate(request.messages) if m.role == "assistant"), default=-1
    )
    for i, m in enumerate(request.messages):
        if rerender_history and m.role == "assistant" and i != last_reply:
            ids.append(ROLE["system"])  # older replies render differently once a turn is added
        ids += [IM_START, ROLE[m.role]]
        for part in m.content:
            if isinstance(part, Image):
                ids.append(V_START)
                n = placeholders(part)
                spans.append((len(ids), len(ids) + n, part.digest))
                ids += [PAD] * n
                ids.append(V_END)
            else:
                if m.role == "system" and not keep_volatile:
                    part = VOLATILE.sub("", part)  # per-request billing headers carry no meaning
                ids += list(part.encode("utf-8"))
        ids.append(IM_END)
    ids += [IM_START, ROLE["assistant"]]
    return ids, spans


def _h(*parts: bytes) -> bytes:
    return hashlib.blake2b(b"|".join(parts), digest_size=16).digest()


class FakeEngine:
    """A correct engine unless a flag breaks it."""

    def __init__(self, capacity_blocks: int = 256, **flags: Any) -> None:
        unknown = set(flags) - {
            "ignore_digest", "ignore_namespace", "bad_merge", "lie", "never_store", "raises",
            "hangs", "nan", "wrong_shape", "wrong_dtype", "rerender", "top_only", "drift",
            "stale_decode", "scale_drift", "store_half", "rerender_history", "volatile",
            "keep_volatile", "slow_hits", "minimal", "ignore_use_cache",
            "stale_features", "images_never_stored", "stale_order",
            "cache_output", "decode_drift", "output_off_by_one",
        }  # fmt: skip
        if unknown:
            raise TypeError(f"unknown flags {unknown}")
        self.flags = flags
        self.capacity = capacity_blocks
        self.cache: OrderedDict[bytes, bytes] = OrderedDict()
        self.resets = 0
        self.evictions = 0
        # stale_features: image features keyed by image size, shared by the cached and the
        # uncached path and kept across reset(): a same-size image gets the first one's
        self.features: dict[tuple[int, ...], str] = {}
        # stale_order: the image features of a request keyed by its set of images, shared by
        # both paths and kept across reset(): the same images in another order get the first
        # order's features (shows only when images come back reordered)
        self.orders: dict[tuple[str, ...], list[str]] = {}
        # cache_output: the prompt+output design (decode-time states stored under prompt +
        # output tokens; replies are printable ASCII, so a reply re-renders to the same ids);
        # decode_drift: a state that came from a decode step reads 2e-6 off when reused (a
        # correct engine on a family whose decode step and prefill differ), declared as its
        # decode rule; output_off_by_one: keys over all k output tokens, state of k - 1 (bug)
        self.caches_output = bool(flags.get("cache_output") or flags.get("output_off_by_one"))
        self.decoded: set[bytes] = set()
        if flags.get("decode_drift"):
            self.decode_atol = 1e-5

    def reset(self) -> None:
        self.cache.clear()
        self.resets += 1

    def _extras(self, pos: int, spans: list[tuple[int, int, str]]) -> bytes:
        for s, e, d in spans:
            if s <= pos < e:
                return f"{d}:{pos - s}".encode()
        return b""

    def _advance(self, state: bytes, token: int, extra: bytes) -> bytes:
        return _h(state, str(token).encode(), extra)

    def _logits(self, state: bytes) -> np.ndarray:
        seed = int.from_bytes(state[:8], "little")
        return np.random.default_rng(seed).standard_normal(VOCAB).astype(np.float32)

    def _keys(self, request: Request, ids: list[int], spans: list) -> list[bytes]:
        ns = b"" if self.flags.get("ignore_namespace") else request.namespace.encode()
        if self.flags.get("rerender"):
            ns += str(len(request.messages)).encode()
        keys, parent = [], _h(b"root", ns)
        for b in range(len(ids) // BLOCK):
            lo, hi = b * BLOCK, (b + 1) * BLOCK
            extras = (
                b""
                if self.flags.get("ignore_digest")
                else b",".join(self._extras(p, spans) for p in range(lo, hi))
            )
            parent = _h(parent, repr(ids[lo:hi]).encode(), extras)
            keys.append(parent)
        return keys

    def _output_states(
        self,
        request: Request,
        ids: list[int],
        spans: list,
        tokens: list[int],
        state: bytes,
    ) -> list[tuple[bytes, bytes]]:
        """The decode-time states of the prompt+output design, per full block past the prompt:
        over every output token but the last (never fed back); with ``output_off_by_one``,
        each output position's state is advanced by its predecessor's token (the output's KV
        stored one position off)."""
        n = len(ids)
        keyed = ids + tokens[:-1]
        ext = keyed
        if self.flags.get("output_off_by_one"):
            ext = [*ids, ids[-1], *tokens[:-2]]
        keys = self._keys(request, keyed, spans)
        out = []
        for pos in range(n, len(ext)):
            state = self._advance(state, ext[pos], b"")
            if (pos + 1) % BLOCK == 0 and pos // BLOCK < len(keys):
                out.append((keys[pos // BLOCK], state))
                self.decoded.add(keys[pos // BLOCK])
        return out

    def run(self, request: Request, *, use_cache: bool) -> Outcome:
        self.calls = getattr(self, "calls", 0) + 1
        header = f"x-billing: {self.calls}\n" if self.flags.get("volatile") else ""
        ids, spans = render(
            request,
            bool(self.flags.get("rerender_history")),
            header,
            bool(self.flags.get("keep_volatile")),
        )
        n = len(ids)
        keys = self._keys(request, ids, spans)
        features = spans  # what the model sees at each image position
        if self.flags.get("stale_features"):
            features = [
                (s, e, self.features.setdefault(img.pixels.shape, d))
                for (s, e, d), img in zip(spans, request.images)
            ]
        if self.flags.get("stale_order") and spans:
            order = self.orders.setdefault(tuple(sorted(d for _, _, d in spans)), [])
            order[:] = order or [d for _, _, d in spans]
            features = [(s, e, d) for (s, e, _), d in zip(spans, order)]
        state, cached = _h(b"ns", request.namespace.encode()), 0
        from_decode = False
        if use_cache or self.flags.get("ignore_use_cache"):
            for b, key in enumerate(keys):
                if (b + 1) * BLOCK > n - 1 or key not in self.cache:
                    break
                state, cached = self.cache[key], (b + 1) * BLOCK
                from_decode = from_decode or key in self.decoded
                self.cache.move_to_end(key)
        hit = cached > 0
        if hit and self.flags.get("raises"):
            raise RuntimeError("cache corrupted while restoring a block")
        if self.flags.get("slow_hits"):
            # prefill costs 50 us a token; restoring a cached token costs five times that
            time.sleep((n - cached) * 50e-6 + cached * 250e-6)
        if hit and self.flags.get("hangs"):
            threading.Event().wait(float(self.flags["hangs"]))  # type: ignore[arg-type]
        merges = []
        for s, e, _ in spans:
            todo = e - max(s, cached)
            if todo > 0:
                merges.append((todo, e - s if self.flags.get("bad_merge") else todo))
        stored: list[tuple[bytes, bytes]] = []
        for pos in range(cached, n):
            state = self._advance(state, ids[pos], self._extras(pos, features))
            if (pos + 1) % BLOCK == 0:
                stored.append((keys[pos // BLOCK], state))
        logits = self._logits(state)
        prompt_state = state
        tokens, steps = [], [logits]
        for _ in range(request.max_new_tokens):
            tok = int(np.argmax(steps[-1]))
            if self.caches_output:  # printable ASCII: the reply re-renders to these ids
                tok = 32 + int(np.argmax(steps[-1][32:127]))
            tokens.append(tok)
            state = self._advance(state, tok, b"")
            if len(tokens) < request.max_new_tokens:
                steps.append(self._logits(state))
        if from_decode and self.flags.get("decode_drift"):
            steps = [(x + np.float32(2e-6)).astype(np.float32) for x in steps]
            logits = steps[0]
        never = self.flags.get("never_store") or (
            self.flags.get("images_never_stored") and request.images
        )
        if use_cache and not never:
            if self.flags.get("stale_decode") and stored and tokens:
                stored[-1] = (stored[-1][0], state)
            if self.flags.get("store_half"):
                stored = [(k, st) for k, st in stored if keys.index(k) < len(keys) // 2]
            if self.caches_output and len(tokens) > 1:
                stored += self._output_states(request, ids, spans, tokens, prompt_state)
            for key, st in stored:
                self.cache[key] = st
                self.cache.move_to_end(key)
            while len(self.cache) > self.capacity:
                self.cache.popitem(last=False)
                self.evictions += 1
        out_logits = logits
        if hit and self.flags.get("nan"):
            out_logits = logits.copy()
            out_logits[7] = np.nan
        if hit and self.flags.get("wrong_shape"):
            out_logits = logits[:-1]
        if hit and self.flags.get("wrong_dtype"):
            out_logits = logits.astype(np.float64)
        if hit and self.flags.get("drift"):
            out_logits = (logits + np.float32(1e-6)).astype(np.float32)
        if hit and self.flags.get("scale_drift"):
            out_logits = (logits * np.float32(1.000001)).astype(np.float32)
        reported = cached
        if self.flags.get("lie") and use_cache:  # the uncached run's own lie: ignore_use_cache
            reported = min(n, cached + BLOCK)
        common: dict[str, Any] = dict(
            text="".join(chr(t) for t in tokens) if self.caches_output else None,
            tokens=tuple(tokens),
            cached_tokens=reported,
            prompt_tokens=n,
            token_ids=tuple(ids),
            image_spans=tuple(spans),
            merges=tuple(merges),
        )
        if self.flags.get("top_only"):
            lp = out_logits.astype(np.float64)
            lp = lp - (lp.max() + np.log(np.exp(lp - lp.max()).sum()))
            top = np.argsort(-lp)[:5]
            return Outcome(top_logprobs={int(i): float(lp[i]) for i in top}, **common)
        step_logits = (out_logits, *steps[1:]) if tokens else ()
        if self.flags.get("minimal"):  # the least an engine must return
            return Outcome(logits=out_logits, tokens=tuple(tokens))
        return Outcome(logits=out_logits, step_logits=step_logits, **common)


def good() -> FakeEngine:
    return FakeEngine()


def _variant(**flags: Any) -> Callable[[], FakeEngine]:
    def build() -> FakeEngine:
        return FakeEngine(**flags)

    return build


ignore_digest = _variant(ignore_digest=True)
ignore_namespace = _variant(ignore_namespace=True)
bad_merge = _variant(bad_merge=True)
lie = _variant(lie=True)
never_store = _variant(never_store=True)
raises = _variant(raises=True)
hangs = _variant(hangs=3600)  # an hour: a session that waited for it would never end in time
nan = _variant(nan=True)
wrong_shape = _variant(wrong_shape=True)
wrong_dtype = _variant(wrong_dtype=True)
rerender = _variant(rerender=True)
top_only = _variant(top_only=True)
top_only_drift = _variant(top_only=True, drift=True)
top_only_ignore_digest = _variant(top_only=True, ignore_digest=True)
drift = _variant(drift=True)


def drift_with_atol() -> FakeEngine:
    """The drifting engine, declaring its own tolerance rule (as presets.llama_server does)."""
    engine = FakeEngine(drift=True)
    engine.atol = 1e-5  # type: ignore[attr-defined]
    return engine


stale_decode = _variant(stale_decode=True)
scale_drift = _variant(scale_drift=True)
store_half = _variant(store_half=True)
rerender_history = _variant(rerender_history=True)
volatile = _variant(volatile=True)
keep_volatile = _variant(keep_volatile=True)
slow_hits = _variant(slow_hits=True)
minimal = _variant(minimal=True)
ignore_use_cache = _variant(ignore_use_cache=True)
stale_features = _variant(stale_features=True)
# two bugs: image requests are never stored (positive control) and text hits drift
two_bugs = _variant(images_never_stored=True, drift=True)
stale_features_instance = FakeEngine(stale_features=True)
minimal_ignore_digest = _variant(minimal=True, ignore_digest=True)
instance = FakeEngine()
not_an_engine = object()
