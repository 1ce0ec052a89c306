"""What a cache of each design can reuse: the three references, side by side.

- **The token oracle** (:mod:`.oracle`): the longest prefix shared with an earlier prompt of
  the same namespace, to the token, capped at ``prompt_tokens - 1``. It is the correctness
  bound for every design: a cache that reports more reused something it could not have.
- **The snapshot-aware reference**: what a cache can reuse when some layers' state cannot be
  trimmed (a recurrent state; a sliding window once it has wrapped), so that it resumes only
  where it holds a snapshot, taken at a boundary it passed while prefilling an earlier
  prompt. A prompt's boundaries are the start of every message (when the engine reports
  ``Outcome.message_starts``), both edges of every image span, and its end. For each earlier
  prompt E the reference allows the largest boundary b of E with
  ``b <= min(shared(r, E), len(r) - 1)``; the maximum over E.
- **Block granularity**: a cache that keeps whole blocks of B tokens only reuses
  ``floor(token_max / B) * B``.

A cache may also store the KV it computed while decoding, under the prompt + output tokens
(``caches_output = True``), so that the next turn carrying the reply reuses it. The
correctness bound always counts an earlier request's output tokens as part of what it left
behind (any design may); the references count them only for a design that declares it: a
prompt-only cache is not judged for missing the reply's KV. Reuse through output tokens stops
at the first token where the next prompt's re-tokenised reply differs from the generated ids.
Whether the decode computed the KV of the last token it generated is the engine's, measured
or declared (``CacheDesign.last_kv``, :mod:`pytest_prefixcache.verify.decode_kv`): mlx-lm's
``generate_step`` computes it before it yields the token, the reference engine never feeds it
back. An engine that never computes it may validly reuse an earlier prompt + all but its last
output token, one that does prompt + all of them; one whose answer is unknown is judged on the
generous side (all of them), and the report says so.

An engine declares the design of its cache (:class:`CacheDesign`); its efficiency, the
positive control and ``--prefixcache-min-efficiency`` are judged against that reference, the
reuse bound always against the token oracle.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import EngineError
from ..traits import traits_of

__all__ = [
    "REUSE_REFERENCES",
    "CacheDesign",
    "ReuseReference",
    "block_reuse",
    "boundaries",
    "last_boundary",
    "reference_name",
]

#: What a cache can reuse by design (see :class:`CacheDesign`).
ReuseReference = Literal["token", "snapshot", "block"]
REUSE_REFERENCES: tuple[ReuseReference, ...] = ("token", "snapshot", "block")


@dataclass(frozen=True)
class CacheDesign:
    """What an engine's prefix cache can reuse by design: the reference its efficiency, the
    positive control and ``--prefixcache-min-efficiency`` are judged against.

    Attributes:
        reference: ``"token"`` (default): any shared prefix, to the token (full-attention KV
            is trimmable to any length). ``"snapshot"``: only up to a boundary the cache
            passed while prefilling an earlier prompt (a message start, an image's edge, the
            prompt's end), as a cache must that keeps non-trimmable state (recurrent layers,
            a sliding window that has wrapped) as snapshots. ``"block"``: whole blocks of
            ``block_size`` tokens only.
        block_size: tokens per block: ``"block"`` needs it, and only ``"block"`` takes it.
        outputs: the cache also stores the KV computed while decoding, under the prompt +
            output tokens (the engine's ``caches_output``); the references then count an
            earlier request's output tokens as reusable.
        last_kv: whether a decode computes the KV of the last token it generates (the
            engine's ``last_token_kv``, or what :mod:`pytest_prefixcache.verify.decode_kv`
            measured): True, False, or None (unknown: the correctness bound counts it).
    """

    reference: ReuseReference = "token"
    block_size: int | None = None
    outputs: bool = False
    last_kv: bool | None = None

    def __post_init__(self) -> None:
        if self.reference not in REUSE_REFERENCES:
            raise EngineError(
                f"reuse_reference={self.reference!r} is not one of "
                + ", ".join(map(repr, REUSE_REFERENCES))
            )
        b = self.block_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b <= 0):
            raise EngineError(f"block_size={b!r} is not a positive int")
        if not isinstance(self.outputs, bool):
            raise EngineError(f"caches_output={self.outputs!r} is not a bool")
        if self.last_kv is not None and not isinstance(self.last_kv, bool):
            raise EngineError(f"last_token_kv={self.last_kv!r} is not a bool or None")
        if (self.reference == "block") != (b is not None):
            raise EngineError(
                "reuse_reference='block' needs a block_size"
                if b is None
                else f"block_size={b} is for reuse_reference='block' only, not {self.reference!r}"
            )

    @classmethod
    def of(cls, engine: object) -> CacheDesign:
        """The design ``engine`` declares with its ``reuse_reference`` attribute (``"token"``
        when absent) and, for ``"block"``, its ``block_size``. An engine may keep blocks and
        still reuse to the token, as the reference engine does: its ``block_size`` alone is
        not a declaration."""
        traits = traits_of(engine)
        reference: Any = traits.reuse_reference
        block = traits.block_size if reference == "block" else None
        outputs: Any = traits.caches_output
        last_kv: Any = traits.last_token_kv
        try:
            return cls(reference, block, outputs, last_kv)
        except EngineError as exc:
            raise EngineError(f"{type(engine).__name__}: {exc}") from None

    def allows(self, token: int, snapshot: int | None) -> int:
        """What this design lets a request reuse of a valid shared prefix of ``token`` tokens
        whose last snapshot boundary is ``snapshot`` (None: not computed)."""
        if self.reference == "snapshot" and snapshot is not None:
            return snapshot
        if self.reference == "block" and self.block_size is not None:
            return block_reuse(token, self.block_size)
        return token

    def computed_outputs(self, generated: int, *, bound: bool) -> int:
        """Of ``generated`` output tokens, those whose KV the decode computed: all of them
        when it computes its last token's KV, all but the last when it never does; unknown
        counts all of them for the correctness bound (``bound``), all but the last for the
        references (what a cache is expected to reuse)."""
        if self.last_kv or (bound and self.last_kv is None):
            return generated
        return max(0, generated - 1)

    @property
    def label(self) -> str:
        """The reference, in words: ``"the snapshot-aware reference"``."""
        what = " (prompt + output tokens)" if self.outputs else ""
        return "the " + reference_name(self.reference, self.block_size) + what


def reference_name(reference: str, block_size: int | None = None) -> str:
    """A reference's short name: ``"token oracle"``, ``"snapshot-aware reference"``,
    ``"block reference (blocks of 16)"``."""
    if reference == "block":
        return f"block reference (blocks of {block_size})"
    return {"token": "token oracle", "snapshot": "snapshot-aware reference"}.get(
        reference, f"{reference} reference"
    )


def boundaries(
    length: int, spans: Sequence[tuple[int, int, str]], message_starts: Sequence[int] | None
) -> tuple[int, ...]:
    """The positions of a prompt of ``length`` tokens where a snapshot cache can hold state,
    ascending: message starts, both edges of every image span, and the end."""
    points = {length, *(message_starts or ())}
    for start, end, _ in spans:
        points.update((start, end))
    return tuple(sorted(p for p in points if 0 <= p <= length))


def last_boundary(bounds: Sequence[int], limit: int) -> int:
    """The largest of the ascending ``bounds`` at or below ``limit`` (0 when none is)."""
    i = bisect_right(bounds, limit)
    return bounds[i - 1] if i else 0


def block_reuse(token_max: int, block_size: int) -> int:
    """The whole blocks of ``block_size`` tokens in a reusable prefix of ``token_max``."""
    return token_max // block_size * block_size
