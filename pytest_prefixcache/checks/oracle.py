"""The reuse oracle: the longest prefix a correct cache could have reused for a request.

A position of a prompt is keyed by its token id and, inside an image's placeholder run, by
(image digest, offset in the image). Two prompts share a prefix of length L when their keys
agree at every position below L, so a placeholder matches only the same image at the same
offset, and text matches text. The oracle's maximum for a request is the longest such prefix
shared with any earlier request of the same namespace, capped at ``prompt_tokens - 1``
because at least one prompt token must be computed to produce logits.

That is the token oracle. Beside it, each :class:`Match` carries the snapshot-aware
reference (the longest boundary of an earlier prompt within the shared prefix) and, for a
block-granular design, the whole blocks of it; see :mod:`.references`.

An earlier request also leaves behind the KV its decode computed: its prompt continued by its
greedy output tokens, the last one included only when the engine's decode computes its KV
(``CacheDesign.last_kv``, measured or declared; unknown counts it for the bound).
``Match.bound`` (the correctness bound) counts them for every engine; the token oracle counts
them only for a design that caches output (``CacheDesign.outputs``). :func:`over_bound` is the
one test of a reported reuse against the bound: the reuse check and the report's over-claim
count both call it.
``Match.decode_start`` is the first position of the prompt whose KV an earlier decode
computed (the end of that request's prompt, when this prompt continues it through its
output): a cached run that reused past it may hold decode-time KV, which on some families is
not bit-exact against a cold prefill (the decode tolerance rule, :mod:`.equivalence`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from .references import CacheDesign, block_reuse, boundaries, last_boundary, reference_name

__all__ = [
    "WARMUP",
    "Match",
    "ReuseOracle",
    "over_bound",
    "position_keys",
    "shared_prefix",
    "source_name",
]

Key = tuple[int, str, int]
"""(token id, image digest or "", offset in the image or -1) for one prompt position."""


def position_keys(token_ids: Sequence[int], spans: Sequence[tuple[int, int, str]]) -> list[Key]:
    """The key of every position of a prompt."""
    keys: list[Key] = [(int(t), "", -1) for t in token_ids]
    for start, end, digest in spans:
        for pos in range(max(start, 0), min(end, len(keys))):
            keys[pos] = (keys[pos][0], digest, pos - start)
    return keys


def shared_prefix(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """The length of the longest common prefix of two sequences (of keys, token ids, ...)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def over_bound(cached_tokens: int | None, limit: int | None) -> bool:
    """A reported reuse of ``cached_tokens`` exceeds the correctness bound ``limit``
    (:attr:`Match.limit`): the reuse bound fails. False when either is unknown."""
    return cached_tokens is not None and limit is not None and cached_tokens > limit


@dataclass(frozen=True)
class Match:
    """The oracle's answer for one request: the token oracle's, and the other references'."""

    max_reuse: int
    """Longest valid reusable prefix, capped at prompt length - 1 (the token oracle)."""
    shared: int
    """Longest shared prefix before the cap."""
    source: int | None
    """Stream index of the earlier request that shares it (None if nothing is shared)."""
    snapshot: int | None = None
    """The snapshot-aware reference: the longest boundary of an earlier prompt within the
    prefix it shares, capped like ``max_reuse`` (None when not computed)."""
    boundary_source: int | None = None
    """Stream index of the earlier request whose boundary gives ``snapshot`` (when every
    boundary is 0: the token oracle's ``source``)."""
    starts_known: bool = True
    """Every earlier prompt of the namespace reported its message starts (else their
    boundaries are image edges and prompt ends only)."""
    block: int | None = None
    """Whole blocks of ``max_reuse``, for a block-granular design (None otherwise)."""
    design: CacheDesign = field(default_factory=CacheDesign)
    """The engine's declared design: which reference judges its efficiency."""
    bound: int | None = None
    """The correctness bound: the longest prefix shared with an earlier prompt continued by
    the output tokens whose KV its decode computed (:meth:`.CacheDesign.computed_outputs`),
    capped like ``max_reuse`` (None: ``max_reuse``). The token oracle of a design that caches
    output counts the same tokens, the last one only when the engine computes its KV."""
    decode_start: int | None = None
    """The first position of this prompt whose KV an earlier request's decode computed (None
    when no earlier output continues into this prompt)."""
    recent: int | None = None
    """What the declared reference allows from the namespace's most recent earlier prompt
    alone (None: no earlier prompt). The positive control's premise is the previous request:
    a cache with bounded capacity may have evicted what older ones left."""

    @property
    def limit(self) -> int:
        """The most any cache can validly reuse (the correctness bound)."""
        return self.max_reuse if self.bound is None else max(self.bound, self.max_reuse)

    def exceeded_by(self, cached_tokens: int | None) -> bool:
        """``cached_tokens`` is more than any cache could validly reuse (:func:`over_bound`)."""
        return over_bound(cached_tokens, self.limit)

    @property
    def allowed(self) -> int:
        """The most the declared reference lets this request reuse."""
        return self.design.allows(self.max_reuse, self.snapshot)

    def references(self) -> str:
        """Every reference's maximum and which one judges, in one line."""
        parts = [f"token oracle {self.max_reuse}"]
        if self.snapshot is not None:
            unknown = "" if self.starts_known else " (message boundaries unknown)"
            src = "" if self.boundary_source is None else f" at {source_name(self.boundary_source)}"
            parts.append(f"snapshot-aware {self.snapshot}{src}{unknown}")
        if self.block is not None:
            parts.append(f"blocks of {self.design.block_size}: {self.block}")
        ref = reference_name(self.design.reference, self.design.block_size)
        return f"reuse references: {', '.join(parts)}; judged against the {ref}"


#: The source index of a server's own warm-up prompt (:meth:`ReuseOracle.add_warmup`).
WARMUP = -1


def source_name(source: int) -> str:
    """An earlier prompt by its source index, for a message: ``request N`` or the warm-up."""
    return "the server's own warm-up prompt" if source == WARMUP else f"request {source}"


@dataclass
class _Prompt:
    index: int
    keys: list[Key]
    bounds: tuple[int, ...]
    starts_known: bool
    output: tuple[Key, ...] = ()
    """The output tokens' keys: the KV its decode computed after the prompt."""


@dataclass
class ReuseOracle:
    """Remembers the prompts of the cached runs so far, per namespace; ``design`` is the
    engine's (block granularity is computed only for a block-granular one)."""

    design: CacheDesign = field(default_factory=CacheDesign)
    _history: dict[str, list[_Prompt]] = field(default_factory=dict)

    def reset(self) -> None:
        self._history.clear()

    def copy(self) -> ReuseOracle:
        """An oracle that has seen the same prompts (adding to it leaves this one as it is)."""
        return ReuseOracle(self.design, {ns: list(p) for ns, p in self._history.items()})

    def match(
        self,
        namespace: str,
        token_ids: Sequence[int],
        spans: Sequence[tuple[int, int, str]],
    ) -> Match:
        """What could validly be reused for this prompt, given the prompts seen before."""
        keys = position_keys(token_ids, spans)
        best, source = 0, None
        full, decode_start = 0, None
        stored, stored_source = 0, None
        snap, snap_source, known = 0, None, True
        cap = len(keys) - 1
        recent: int | None = None
        history = self._history.get(namespace, ())
        for p in history:
            n = shared_prefix(keys, p.keys)
            if n > best:
                best, source = n, p.index
            ext = shared_prefix(keys[n:], p.output) if n == len(p.keys) else 0
            if ext and (decode_start is None or n < decode_start):
                decode_start = n
            # the output tokens whose KV the decode computed: the last one by the engine's answer
            full = max(full, n + min(ext, self.design.computed_outputs(len(p.output), bound=True)))
            m = n + min(ext, self.design.computed_outputs(len(p.output), bound=False))
            if m > stored:
                stored, stored_source = m, p.index
            b = last_boundary(p.bounds, min(n, len(keys) - 1))
            if b > snap:
                snap, snap_source = b, p.index
            known = known and p.starts_known
        if history:  # the loop's last prompt is the namespace's most recent: what it alone leaves
            shared = max(n, m) if self.design.outputs else n
            recent = self.design.allows(max(0, min(shared, cap)), b)
        if self.design.outputs and stored > best:
            best, source = stored, stored_source
        token = max(0, min(best, cap))
        block = self.design.block_size
        return Match(
            token,
            best,
            source,
            snapshot=snap,
            boundary_source=source if snap_source is None else snap_source,
            starts_known=known,
            block=None if block is None else block_reuse(token, block),
            design=self.design,
            bound=max(0, min(full, cap)),
            decode_start=decode_start if decode_start is not None and decode_start < cap else None,
            recent=recent,
        )

    def elsewhere(
        self, scope: str, token_ids: Sequence[int], spans: Sequence[tuple[int, int, str]]
    ) -> tuple[int, str | None]:
        """The longest prefix (capped at ``len - 1``) this prompt shares with a prompt seen in
        another scope (namespace or adapter), and that scope: what an engine keying without
        the identity could reuse (:mod:`.isolation`)."""
        keys = position_keys(token_ids, spans)
        best, where = 0, None
        for other, prompts in self._history.items():
            if other != scope:
                for p in prompts:
                    n = min(shared_prefix(keys, p.keys), len(keys) - 1)
                    if n > best:
                        best, where = n, other
        return best, where

    def add_warmup(self, prompts: Sequence[Sequence[int]]) -> None:
        """The prompts a server ran on its own before the stream (its warm-up, seen by the
        tap): earlier requests of the default namespace, source :data:`WARMUP`, no output."""
        for ids in prompts:
            self.add(WARMUP, "", ids, ())

    def add(
        self,
        index: int,
        namespace: str,
        token_ids: Sequence[int],
        spans: Sequence[tuple[int, int, str]],
        message_starts: Sequence[int] | None = None,
        output: Sequence[int] = (),
    ) -> None:
        """Record the prompt of the cached run of stream request ``index`` (with the
        positions where its messages start, when the engine reported them, and the output
        tokens its decode computed the KV of)."""
        bounds = boundaries(len(token_ids), spans, message_starts)
        out = tuple((int(t), "", -1) for t in output)
        prompt = _Prompt(
            index, position_keys(token_ids, spans), bounds, message_starts is not None, out
        )
        self._history.setdefault(namespace, []).append(prompt)
