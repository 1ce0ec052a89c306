"""The adapter protocol: the values an engine receives and returns.

These types are the whole contract between pytest-prefixcache and an engine. They depend on
numpy and (lazily) Pillow only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np

from .errors import ImageError, RequestError
from .image_io import decode_source, pil_to_rgb
from .reuse_claims import Claim, Claims, ClaimUnit, StepEntry

if TYPE_CHECKING:
    from PIL import Image as PILImage

__all__ = [
    "ROLES",
    "Claim",
    "ClaimUnit",
    "Claims",
    "Engine",
    "Image",
    "Message",
    "Outcome",
    "Part",
    "ReplyOf",
    "Request",
    "StepEntry",
    "Wave",
]

ROLES = ("system", "user", "assistant")


class ShortRepr:
    """Pretty-printed (by Hypothesis and IPython) as its ``repr``, not field by field: a
    failing example then shows one line, not the pixels, logits or report its fields hold."""

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))


def _pixel_digest(pixels: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(b"rgb8:" + ",".join(str(d) for d in pixels.shape).encode() + b":")
    h.update(np.ascontiguousarray(pixels).tobytes())
    return h.hexdigest()


@dataclass(frozen=True, eq=False)
class Image(ShortRepr):
    """An RGB image: ``pixels`` is a read-only uint8 array of shape (H, W, 3).

    ``digest`` is the sha256 over the shape and the pixel bytes, so the same pixels give the
    same digest whatever container (PNG, BMP, ...) they came from. Two images are equal when
    their digests are.
    """

    pixels: np.ndarray
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        px = self.pixels
        if not isinstance(px, np.ndarray):
            raise ImageError(f"Image pixels must be a numpy array, got {type(px).__name__}")
        if px.dtype != np.uint8:
            raise ImageError(f"Image pixels must be uint8, got dtype {px.dtype}")
        if px.ndim != 3 or px.shape[2] != 3:
            raise ImageError(f"Image pixels must have shape (H, W, 3), got {px.shape}")
        if px.shape[0] == 0 or px.shape[1] == 0:
            raise ImageError(f"Image has zero size: shape {px.shape}")
        if px.flags.writeable or not px.flags.c_contiguous:
            px = np.array(px, dtype=np.uint8, order="C")
            px.setflags(write=False)
            object.__setattr__(self, "pixels", px)
        object.__setattr__(self, "digest", _pixel_digest(px))

    @classmethod
    def from_pil(cls, img: PILImage.Image) -> Image:
        """Build from a Pillow image (EXIF orientation applied, converted to RGB)."""
        return cls(pil_to_rgb(img))

    @classmethod
    def open(cls, source: str | os.PathLike[str] | bytes | bytearray | memoryview) -> Image:
        """Decode a file path or encoded bytes with Pillow; raise ImageError naming the source."""
        return cls(decode_source(source))

    def to_pil(self) -> PILImage.Image:
        """A Pillow RGB image with the same pixels."""
        from PIL import Image as PILImage

        return PILImage.fromarray(np.array(self.pixels), mode="RGB")

    @property
    def size(self) -> tuple[int, int]:
        """(width, height), as Pillow reports it."""
        return (int(self.pixels.shape[1]), int(self.pixels.shape[0]))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Image) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        w, h = self.size
        return f"Image({w}x{h}, digest={self.digest[:12]})"


Part = str | Image


class ReplyOf(str):
    """A closed-loop marker in a generated stream: the engine's own greedy reply to stream
    request ``request``, decoded to text (:attr:`Outcome.text`).

    It is a ``str`` (so a message holding one is a valid :class:`Message`) whose value is a
    readable placeholder; the verifier replaces it with the reply of the cached run of request
    ``request`` before the engine sees the request, and the uncached run gets the same text.
    Streams saved for replay hold the concrete text, never a marker.
    """

    request: int

    def __new__(cls, request: int) -> ReplyOf:
        if isinstance(request, bool) or not isinstance(request, int) or request < 0:
            raise RequestError(f"ReplyOf request must be a stream index >= 0, got {request!r}")
        self = super().__new__(cls, f"<the reply to request {request}>")
        self.request = request
        return self

    def __repr__(self) -> str:
        return f"ReplyOf({self.request})"

    def __reduce__(self) -> tuple[type[ReplyOf], tuple[int]]:
        return (ReplyOf, (self.request,))


@dataclass(frozen=True)
class Message:
    """One chat message: a role and an ordered tuple of text and image parts."""

    role: Literal["system", "user", "assistant"]
    content: tuple[Part, ...]

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise RequestError(f"Message role {self.role!r} is not one of {', '.join(ROLES)}")
        content: Any = self.content
        if isinstance(content, (str, Image)):
            content = (content,)
        try:
            content = tuple(content)
        except TypeError:
            raise RequestError(
                f"Message content must be a tuple of str and Image parts, got "
                f"{type(self.content).__name__}"
            ) from None
        for i, part in enumerate(content):
            if not isinstance(part, (str, Image)):
                raise RequestError(
                    f"Message content[{i}] is a {type(part).__name__}; parts must be str or Image"
                )
        object.__setattr__(self, "content", content)

    @property
    def images(self) -> tuple[Image, ...]:
        return tuple(p for p in self.content if isinstance(p, Image))


@dataclass(frozen=True)
class Request:
    """A chat request. Requests in different namespaces (tenants, cache salts) or with
    different adapters must never share cache entries.

    ``adapter`` names a LoRA adapter the engine serves (its ``adapters`` trait; None: the base
    model). Servers receive it as the request's ``model`` name (vLLM, llama-server), the
    namespace as a header or body field such as vLLM's ``cache_salt`` (docs/adapters.md).
    """

    messages: tuple[Message, ...]
    namespace: str = ""
    max_new_tokens: int = 0
    adapter: str | None = None

    def __post_init__(self) -> None:
        messages = tuple(self.messages)
        if not messages:
            raise RequestError("Request.messages is empty; a request needs at least one message")
        for i, m in enumerate(messages):
            if not isinstance(m, Message):
                raise RequestError(f"Request.messages[{i}] is a {type(m).__name__}, not a Message")
        if not isinstance(self.namespace, str):
            raise RequestError(f"Request.namespace must be a str, got {self.namespace!r}")
        if self.adapter is not None and (not isinstance(self.adapter, str) or not self.adapter):
            raise RequestError(
                f"Request.adapter must be None or a non-empty str, got {self.adapter!r}"
            )
        n = self.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise RequestError(f"Request.max_new_tokens must be an int >= 0, got {n!r}")
        object.__setattr__(self, "messages", messages)

    @property
    def scope(self) -> str:
        """The cache identity the request is served under: its namespace, and its adapter
        when it has one (requests of different scopes share nothing)."""
        return (
            self.namespace if self.adapter is None else f"{self.namespace}\0adapter={self.adapter}"
        )

    @property
    def images(self) -> tuple[Image, ...]:
        """Every image in the request, in order of appearance."""
        return tuple(img for m in self.messages for img in m.images)


#: The longest arrival offset of a request in a wave, in seconds.
MAX_ARRIVAL = 10.0


@dataclass(frozen=True)
class Wave:
    """Requests in flight together: request i is sent ``arrivals[i]`` seconds after the wave
    starts (all at once when ``arrivals`` is empty), and each is answered before the next
    wave starts."""

    requests: tuple[Request, ...]
    arrivals: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        reqs = tuple(self.requests)
        if not reqs or not all(isinstance(r, Request) for r in reqs):
            raise RequestError(f"Wave.requests must be a non-empty tuple of Request, got {reqs!r}")
        arrivals = tuple(self.arrivals) or (0.0,) * len(reqs)
        if len(arrivals) != len(reqs):
            raise RequestError(
                f"Wave.arrivals has {len(arrivals)} offsets for {len(reqs)} requests"
            )
        for i, a in enumerate(arrivals):
            ok = isinstance(a, (int, float)) and not isinstance(a, bool)
            if not ok or not 0.0 <= float(a) <= MAX_ARRIVAL:
                raise RequestError(
                    f"Wave.arrivals[{i}] is {a!r}; an arrival is seconds from 0 to {MAX_ARRIVAL:g}"
                )
        object.__setattr__(self, "requests", reqs)
        object.__setattr__(self, "arrivals", tuple(float(a) for a in arrivals))

    def __len__(self) -> int:
        return len(self.requests)


@dataclass(frozen=True, eq=False)
class Outcome(ShortRepr):
    """What an engine returns for one request.

    Attributes:
        logits: float32 array over the vocabulary at the last prompt position, or None.
        top_logprobs: token id -> logprob (k >= 5), for engines that expose only these.
        tokens: the greedy continuation (``max_new_tokens`` long, or shorter on EOS).
        step_logits: the logits before each continuation token (``step_logits[0]`` is
            ``logits``); empty when the engine does not expose them.
        step_top_logprobs: the top_logprobs of each decode step (``step_top_logprobs[0]`` is
            ``top_logprobs``), for engines that expose only these; compared at every step
            when ``step_logits`` are absent.
        cached_tokens: prompt tokens reused from the cache, or None if not reported.
        prompt_tokens: prompt length in tokens, or None.
        token_ids: the full prompt's token ids, or None.
        image_spans: (start, end, image digest) for each image's placeholder run in token_ids.
        merges: (placeholder slots filled, embedding rows merged) per vision merge done.
        message_starts: the positions in ``token_ids`` where a message's rendering begins,
            ascending (the first message's at 0: a template's preamble counts as part of it),
            or None when not reported. An engine may leave out a message whose start it
            cannot tell (a template that merges the system text into the first user turn).
            The snapshot-aware reference resumes at these boundaries.
        claims: what the engine claimed against what its model computed (see :class:`Claims`),
            or None when the engine declares no claim sources.
        served: the order in which the engine admitted this request among the requests it
            served concurrently: an admission index that grows with every cached request the
            engine admits (its scheduler's order, not the client's), or None when not
            reported. Under concurrency the reuse oracle judges claimed reuse in this order;
            without it, against every other request of the wave (any order was possible).
        text: the greedy continuation decoded to text as a chat client sees it (special
            tokens left out), or None when not reported. Closed-loop streams send it back as
            the next assistant turn (:class:`ReplyOf`).
        first_token_seconds: seconds from the engine taking the request to its first token's
            logits: the time to first token (render, lookup, restore, vision, prefill, and a
            wait for other requests in flight), or the prompt-processing seconds a server
            reports; None when not reported. The part of a request a prefix cache can save:
            ``--prefixcache-min-speedup`` judges cache hits on it when every hit reports it
            (decode costs the same warm and cold), else on whole calls, and says which.
        attribution: how an observer of a batching server's model (the logit tap) tied this
            reply to the rows it computed: ``"id"`` (the server's scheduler labelled the rows
            with the request's id), ``"sequential"`` (inferred, with no other request's rows
            running meanwhile), ``"guessed"`` (inferred among requests in flight), or None
            (nothing observed the model: the engine's own figures).
        speculated: the decode ran draft-then-verify (speculative decoding): True, False, or
            None (the engine does not say). A cached run that speculated judged against a cold
            run that did not is the ``speculation`` coverage row.
        prompt_logprobs: per prompt position, token id -> logprob of that position's
            distribution (the prompt's own token among them), as vLLM's ``prompt_logprobs``
            request field returns them; position 0 (nothing before it) is None. None when
            the engine does not report them. The prompt-logprobs check compares the cached
            positions' values with the cold run's (:mod:`.checks.prompt_logprobs`).
        unreported_stop: the engine stopped before its first new token and did not report
            that token (a server's ``finish_reason "stop"`` with 0 completion tokens and no
            logprobs): its greedy first token was a stop token; no tokens, no logits.
    """

    logits: np.ndarray | None = None
    top_logprobs: Mapping[int, float] | None = None
    tokens: tuple[int, ...] = ()
    step_logits: tuple[np.ndarray, ...] = ()
    step_top_logprobs: tuple[Mapping[int, float], ...] = ()
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    token_ids: tuple[int, ...] | None = None
    image_spans: tuple[tuple[int, int, str], ...] | None = None
    merges: tuple[tuple[int, int], ...] | None = None
    claims: Claims | None = None
    message_starts: tuple[int, ...] | None = None
    served: int | None = None
    text: str | None = None
    first_token_seconds: float | None = None
    attribution: str | None = None
    speculated: bool | None = None
    prompt_logprobs: tuple[Mapping[int, float] | None, ...] | None = None
    unreported_stop: bool = False

    def __repr__(self) -> str:
        shape = None if self.logits is None else self.logits.shape
        return (
            f"Outcome(logits={shape}, tokens={self.tokens}, cached_tokens={self.cached_tokens}, "
            f"prompt_tokens={self.prompt_tokens}, images={len(self.image_spans or ())}, "
            f"merges={self.merges})"
        )


@runtime_checkable
class Engine(Protocol):
    """What the plugin drives. ``use_cache=False`` neither reads nor writes the cache.

    What else an engine declares (images, namespaces, its cache design, tolerances, its
    capacity, concurrency...) are its traits: plain attributes or one ``traits =
    EngineTraits(...)``, every one documented in :class:`~pytest_prefixcache.traits.EngineTraits`
    and checked when the engine is loaded (a misspelled trait is an error naming the nearest
    one). Optional methods: ``cache_usage() -> Mapping[str, int]`` with ``resident_bytes``,
    ``entries`` and ``max_bytes`` (the memory-budget check), ``close()``, and
    ``fresh_instance()`` (a fresh engine for the baseline audit, cheaper than the factory), and
    ``restart(changed: str | None)`` (with the traits ``persists`` and ``restart_changes``: the
    restart streams of ``--prefixcache-restarts``, :mod:`pytest_prefixcache.verify.restarts`),
    and ``kv_computed(outcome) -> int | None`` (the KV positions an observer of the model saw
    computed for the request a cached Outcome answered: the decode-KV probe's evidence,
    :mod:`pytest_prefixcache.verify.decode_kv`).

    Concurrent service is opt-in: ``max_concurrency: int`` above 1 declares that ``run`` may be
    called from up to that many threads at once and that the engine batches or interleaves
    the requests in flight (sharing their prefix blocks as it can). The plugin then adds the
    waves property (``test_waves``): waves of concurrent cached requests, each reply compared
    with the same request served alone on the cold baseline, and a cache-off wave as the
    noise control (``use_cache=False`` calls in flight together, too). ``reset`` is called
    only when no request is in flight. Such an engine reports ``Outcome.served`` where it can,
    and declares ``batch_invariant = True`` when a reply never depends on the requests in
    flight with it: a cold wave that differs from the same requests alone is then a batching
    fault (a failure), not batch non-invariance (a finding).
    """

    def run(self, request: Request, *, use_cache: bool) -> Outcome: ...

    def reset(self) -> None: ...
