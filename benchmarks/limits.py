"""The physical limit a warm run is measured against: what no correct prefix cache can avoid.

For a request whose first ``start`` tokens a cache reuses, any correct engine must still

- encode the images it has never seen (preprocessing and the vision tower), and
- run the language model over the uncached suffix, each suffix position attending to the
  whole prefix (the prefix's KV rows must be read; they need not be recomputed).

``limit`` times exactly that, with the prefix's KV already in place in a buffer with room
for the suffix (no copy, no restore), the images the engine had already encoded taken from
its vision cache, and everything else done beforehand and untimed: rendering and tokenising
the prompt, M-RoPE position ids, hashing, lookup, restoring and storing blocks. So warm /
limit is the cache's whole overhead; 1.0 is a cache that costs nothing.

*suffix-only* (the earlier benchmark's "physical limit") prefills the suffix from an EMPTY
cache, with no prefix: that is not the computation the request needs (its logits are those
of another prompt) and it leaves out the suffix's attention over the prefix, which on this
CPU dominates a small model with a long prefix (one 256-query chunk over 5,000 cached keys
costs about 0.4 s with hidden 64); it is kept for comparison only, never as a target.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from pytest_prefixcache import Request

__all__ = ["Limit", "limit"]


@dataclass(frozen=True)
class Limit:
    """Seconds of the work no prefix cache can avoid for one request (see the module)."""

    start: int
    """Tokens the engine would reuse now (its lookup, before the warm run)."""
    limit_s: float
    """New images encoded + suffix forward over the prefix KV in place."""
    embed_s: float
    """The input-embedding part of ``limit_s`` (new images encoded, rows merged)."""
    suffix_only_s: float
    """The suffix from an empty cache, its images encoded afresh (not a valid limit)."""


def limit(engine: Any, request: Request) -> Limit:
    """Time the limit of ``request`` on the reference ``engine`` (its caches as they are,
    nothing stored; the vision counters may move)."""
    import mlx.core as mx

    model = engine.model
    ns = request.namespace
    known = {img.digest: engine.vision.peek(img.digest, ns) for img in request.images}
    fresh = {img.digest: engine.vision.prepare(img, use_cache=False) for img in request.images}
    rendered = engine.render(request, fresh)
    ids = rendered.token_ids
    positions, _ = model.positions(ids, [fresh[i.digest].grid for i in rendered.images])
    mx.eval(positions)
    reuse = engine.lookup(engine.keys(rendered, request), len(ids))
    start = reuse.tokens
    try:
        cache = engine.restore(reuse, len(ids) + request.max_new_tokens)
        mx.eval([c.keys for c in cache], [c.values for c in cache])
        needed = {d for (_, end, d) in rendered.spans if end > start}
        t0 = time.perf_counter()
        prepared = {}
        for img in request.images:
            entry = known[img.digest]
            if entry is not None and entry.rows is not None:
                prepared[img.digest] = replace(entry)
            elif img.digest in needed:  # never encoded: preprocess it now, inside the timing
                prepared[img.digest] = engine.vision.prepare(img, use_cache=False)
            else:
                prepared[img.digest] = fresh[img.digest]
        embeds, _ = engine.suffix_embeddings(rendered, prepared, start, use_cache=True)
        mx.eval(embeds)
        embed_s = time.perf_counter() - t0
        model.forward(ids[start:], embeds, cache, positions[:, :, start:])
        limit_s = time.perf_counter() - t0
    finally:
        engine.pool.release(reuse.blocks)
    t0 = time.perf_counter()
    embeds, _ = engine.suffix_embeddings(rendered, fresh, start, use_cache=False)
    model.forward(ids[start:], embeds, model.make_cache(), positions[:, :, start:])
    return Limit(start, limit_s, embed_s, time.perf_counter() - t0)
