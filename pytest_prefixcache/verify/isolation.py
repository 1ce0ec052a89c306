"""The timing side-channel audit's measurement (``--prefixcache-isolation``): time to first
token across namespaces and within one, on fresh random prompts; judged by
:class:`~pytest_prefixcache.checks.timing.IsolationResult` (see :mod:`..checks.timing`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..checks.timing import ALPHA, IsolationResult, ks_2samp
from ..types import Engine, Message, Outcome, Request

__all__ = [
    "NAMESPACES",
    "SAMPLES",
    "WORDS",
    "Identity",
    "TimedRun",
    "audit",
    "identity_pairs",
    "timed",
]

#: Timed requests per group (candidate, fresh, control hit, control miss).
SAMPLES = 30
#: Words per prompt: long enough that a cache hit is clearly faster than a prefill.
WORDS = 80
_WARMUP = 3
_VOCAB = (
    "amber basalt cedar delta ember fjord granite harbor island juniper kestrel lagoon meadow "
    "nectar orchid pebble quartz raven saffron tundra umber valley willow xenon yarrow zephyr "
    "anchor beacon canyon dune estuary falcon glacier heron inlet jasper kelp lantern marble "
    "nimbus oasis prairie quiver reef summit thistle upland vortex wharf yonder zenith"
).split()

TimedRun = Callable[[Request], tuple[Outcome, float]]
"""Runs a request with the cache on and returns its outcome and seconds to first token."""


def timed(engine: Engine) -> TimedRun:
    """A :data:`TimedRun` that calls ``engine.run(request, use_cache=True)`` directly."""

    def run(request: Request) -> tuple[Outcome, float]:
        start = time.perf_counter()
        out = engine.run(request, use_cache=True)
        return out, time.perf_counter() - start

    return run


def _prompt(rng: np.random.Generator, words: int) -> str:
    return " ".join(_VOCAB[i] for i in rng.integers(0, len(_VOCAB), size=words))


Identity = tuple[str, str | None]
"""A (namespace, adapter) pair the audit sends requests under."""
#: The audit's default pair: two namespaces (tenants, salts), no adapter.
NAMESPACES: tuple[Identity, Identity] = (("A", None), ("B", None))


def identity_pairs(
    namespaces: bool, adapters: tuple[str, ...]
) -> dict[str, tuple[Identity, Identity]]:
    """The (victim, other) identities the audit runs across, by label: two namespaces (when the
    engine takes them) and, for each adapter, the base model against it in one namespace (the
    default one, "", when the engine takes none: llama-server's adapters)."""
    pairs = {"namespaces": NAMESPACES} if namespaces else {}
    space = "A" if namespaces else ""
    for name in adapters:
        pairs[f"adapter {name!r}"] = ((space, None), (space, name))
    return pairs


def _request(text: str, identity: Identity | str) -> Request:
    namespace, adapter = (identity, None) if isinstance(identity, str) else identity
    return Request((Message("user", (text,)),), namespace=namespace, adapter=adapter)


def audit(
    run: TimedRun,
    *,
    samples: int = SAMPLES,
    words: int = WORDS,
    alpha: float = ALPHA,
    seed: int = 0,
    reset: Callable[[], object] | None = None,
    across: tuple[Identity, Identity] = NAMESPACES,
    label: str = "namespaces",
) -> IsolationResult:
    """Measure time to first token across namespaces and within one (the positive control).

    Args:
        run: runs one request with the cache on; returns the outcome and its seconds.
        samples: timed requests per group. Default: ``SAMPLES``.
        words: words per prompt. Default: ``WORDS``.
        alpha: significance level. Default: ``ALPHA``.
        seed: seed of the prompts and of the order within each sample. Default: ``0``.
        reset: called first and last (the engine's ``reset``), if given. Default: ``None``.
        across: the (victim, other) identities: the victim caches a prompt, the other sends
            it (:func:`identity_pairs`). Default: two namespaces, no adapter.
        label: what the pair differs in, for the result's lines. Default: ``"namespaces"``.
    """
    if samples < 2 or words < 1 or not 0 < alpha < 1:
        raise ValueError(f"need samples >= 2, words >= 1, 0 < alpha < 1: {samples=} {words=} "
                         f"{alpha=}")  # fmt: skip
    rng = np.random.default_rng(seed)
    if reset is not None:
        reset()
    victim, other_id = across
    for i in range(_WARMUP):
        # a namespace of its own where the victim has one (none sent where it has none)
        run(_request(_prompt(rng, words), (f"warmup-{i}" if victim[0] else "", victim[1])))
    candidate: list[float] = []
    fresh: list[float] = []
    hit: list[float] = []
    miss: list[float] = []
    cached: list[int | None] = []
    for _ in range(samples):
        shared, other, own, new = (_prompt(rng, words) for _ in range(4))
        run(_request(shared, victim))  # the victim caches a prefix
        run(_request(own, victim))
        order = rng.permutation(4)
        for k in order:
            if k == 0:
                out, t = run(_request(shared, other_id))
                candidate.append(t)
                cached.append(out.cached_tokens)
            elif k == 1:
                fresh.append(run(_request(other, other_id))[1])
            elif k == 2:
                hit.append(run(_request(own, victim))[1])
            else:
                miss.append(run(_request(new, victim))[1])
    if reset is not None:
        reset()
    return IsolationResult(
        cross=ks_2samp(candidate, fresh),
        control=ks_2samp(hit, miss),
        candidate=tuple(candidate),
        fresh=tuple(fresh),
        control_hit=tuple(hit),
        control_miss=tuple(miss),
        candidate_cached=tuple(cached),
        alpha=alpha,
        across=label,
    )
