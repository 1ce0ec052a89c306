"""What an engine declares about itself beyond the two methods of
:class:`~pytest_prefixcache.types.Engine`: its traits, in one typed record.

An engine declares a trait as a plain attribute (``supports_images = False``) or all of them
at once as ``traits = EngineTraits(...)``; an undeclared trait takes the default below. The
plugin reads them only through :func:`traits_of`, and :func:`check_traits` runs when the engine
is loaded: an attribute one typo away from a trait (``supports_image``) or a value of the wrong
kind is an error that names the engine, the attribute and the trait it was meant to be.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal

from .errors import EngineError

__all__ = ["TRAIT_NAMES", "EngineTraits", "check_traits", "optional_method", "traits_of"]

Reference = Literal["token", "snapshot", "block"]


@dataclass(frozen=True)
class EngineTraits:
    """Every trait the plugin reads, with its default.

    Attributes:
        supports_images: streams and scenarios may carry images (False: text only).
        supports_namespaces: requests may carry a namespace (tenant); False: they never do.
        supports_fresh_instances: the baseline audit may build fresh instances of the engine.
        fresh_instances_missing: why it cannot, shown in the report (with the above False).
        fresh_instance_share: how many audited requests one fresh instance may answer (they
            never share an image or a first message).
        reuse_reference: what the cache can reuse by design, the reference its efficiency and
            positive control are judged against (see
            :class:`~pytest_prefixcache.checks.references.CacheDesign`).
        block_size: with ``reuse_reference = "block"``: the block size, in tokens.
        caches_output: the cache also stores the KV computed while decoding, under prompt +
            output tokens (the references then count output tokens as reusable).
        last_token_kv: its decode computes the KV of the last token it generates (the reuse
            bound counts that token only then); None: undeclared, a server under the tap or
            with claims is probed (:mod:`pytest_prefixcache.verify.decode_kv`).
        decode_kv_probe: probe ``last_token_kv`` at start when it is undeclared.
        atol: the engine's own tolerance, used when no tolerance option is given.
        tolerance_rule: the name of that rule in the report.
        decode_atol: the tolerance of a request whose cached run reused decode KV.
        decode_rule: its name in the report.
        cache_capacity_tokens: the most tokens the cache holds, the uncached runs' included
            when they share it (a repeat beyond it may miss: the positive control's finding
            ``cache capacity``).
        max_concurrency: above 1, ``run`` may be called from that many threads at once and
            the engine batches the requests in flight (the waves property runs).
        batch_invariant: a reply never depends on the requests in flight with it: a cold wave
            that differs from the same requests alone is a batching fault, not a finding.
        coverage_hints: ``"server"`` for an engine behind HTTP (the coverage table says so).
        uncached_times_skewed: why the uncached runs' times are not comparable ("" if they
            are): the speed figures say so instead of judging.
        cold_waves_serial: why the uncached runs of a wave are served one at a time ("" when
            they are sent together): that cold wave then tells no batching fault from a cache
            fault, and a failure says so instead of blaming the cache.
        persists: its cache outlives a restart (with the optional method ``restart``): the
            restart streams of ``--prefixcache-restarts`` run.
        restart_changes: what a restart may change (``weights``, ``template``, ``kv_dtype``,
            ``adapter``...): a restart with one of them changed must reuse nothing.
        adapters: the adapter names a request may carry (``Request.adapter``); empty: the
            streams never send one. Requests with different adapters share nothing.
        returns_prompt_logprobs: its outcomes carry ``prompt_logprobs`` (vLLM's request field
            of that name): the prompt-logprobs row is then shown for every request, and a
            reply without them is a coverage gap.
    """

    supports_images: bool = True
    supports_namespaces: bool = True
    supports_fresh_instances: bool = True
    fresh_instances_missing: str | None = None
    fresh_instance_share: int = 1
    reuse_reference: Reference = "token"
    block_size: int | None = None
    caches_output: bool = False
    last_token_kv: bool | None = None
    decode_kv_probe: bool = False
    atol: float | None = None
    tolerance_rule: str = ""
    decode_atol: float | None = None
    decode_rule: str = ""
    cache_capacity_tokens: int | None = None
    max_concurrency: int = 1
    batch_invariant: bool = False
    coverage_hints: str = ""
    uncached_times_skewed: str = ""
    cold_waves_serial: str = ""
    persists: bool = False
    restart_changes: tuple[str, ...] = ()
    adapters: tuple[str, ...] = ()
    returns_prompt_logprobs: bool = False


TRAIT_NAMES: tuple[str, ...] = tuple(f.name for f in fields(EngineTraits))
_DEFAULTS = EngineTraits()
#: the optional methods the plugin calls when present: not traits, never misspellings of one
_METHODS = ("cache_usage", "close", "fresh_instance", "kv_computed", "restart", "run", "reset")
#: What a declared trait's value is (anything else an engine holds is not a trait's misspelling).
_PLAIN = (bool, int, float, str, tuple, list, type(None))
_KINDS: dict[str, tuple[type, ...]] = {
    "supports_images": (bool,), "supports_namespaces": (bool,),
    "supports_fresh_instances": (bool,), "fresh_instances_missing": (str, type(None)),
    "fresh_instance_share": (int,), "reuse_reference": (str,), "block_size": (int, type(None)),
    "caches_output": (bool,), "last_token_kv": (bool, type(None)), "decode_kv_probe": (bool,),
    "atol": (int, float, type(None)), "tolerance_rule": (str,),
    "decode_atol": (int, float, type(None)), "decode_rule": (str,),
    "cache_capacity_tokens": (int, type(None)), "max_concurrency": (int,),
    "batch_invariant": (bool,), "coverage_hints": (str,), "uncached_times_skewed": (str,),
    "cold_waves_serial": (str,), "persists": (bool,), "restart_changes": (tuple, list),
    "adapters": (tuple, list),
    "returns_prompt_logprobs": (bool,),
}  # fmt: skip


def _declared(engine: object) -> EngineTraits | None:
    traits = getattr(engine, "traits", None)
    return traits if isinstance(traits, EngineTraits) else None


def traits_of(engine: object) -> EngineTraits:
    """The engine's traits: its ``traits`` record when it has one, each attribute it sets
    on top of it (an attribute wins: presets adjust one trait of an engine), else the
    defaults. Read at the time of the call (an engine may learn a trait as it starts)."""
    base = _declared(engine) or _DEFAULTS
    values = {name: getattr(engine, name, getattr(base, name)) for name in TRAIT_NAMES}
    return EngineTraits(**values)


def optional_method(engine: object, name: str) -> Callable[..., Any] | None:
    """The engine's optional method ``name`` (``cache_usage``, ``close``,
    ``fresh_instance``), or None when it has none."""
    method = getattr(engine, name, None)
    return method if callable(method) else None


def check_traits(engine: object, label: str = "") -> EngineTraits:
    """:func:`traits_of`, after checking every declaration: a public attribute one typo away
    from a trait, or a trait of the wrong kind, raises :class:`EngineError` naming both."""
    who = label or type(engine).__name__
    traits = getattr(engine, "traits", None)
    if traits is not None and not isinstance(traits, EngineTraits):
        raise EngineError(
            f"engine {who}: `traits` is {type(traits).__name__}; declare an EngineTraits "
            "(from pytest_prefixcache import EngineTraits)"
        )
    for name in dir(engine):
        if name.startswith("_") or name in TRAIT_NAMES or name in _METHODS or name == "traits":
            continue
        try:  # only a value a trait could hold: an engine's own objects are not misspellings
            plain = isinstance(inspect.getattr_static(engine, name), _PLAIN)
        except AttributeError:
            plain = False
        if not plain:
            continue
        near = difflib.get_close_matches(name, TRAIT_NAMES, n=1, cutoff=0.85) or [
            t
            for t in TRAIT_NAMES
            if "_" in name and t.startswith(f"{name}_")  # cache_capacity
        ]
        if near:
            raise EngineError(
                f"engine {who}: attribute {name!r} is not a trait; did you mean {near[0]!r}? "
                "(pytest_prefixcache.traits.EngineTraits lists them)"
            )
    result = traits_of(engine)
    for name, kinds in _KINDS.items():
        value = getattr(result, name)
        wrong = not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool))
        if wrong:
            allowed = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
            raise EngineError(f"engine {who}: trait {name} is {value!r}; expected {allowed}")
    if result.reuse_reference not in ("token", "snapshot", "block"):
        raise EngineError(
            f"engine {who}: trait reuse_reference is {result.reuse_reference!r}; expected "
            "'token', 'snapshot' or 'block'"
        )
    if result.reuse_reference == "block" and not (result.block_size or 0) > 0:
        raise EngineError(f"engine {who}: reuse_reference 'block' needs a positive block_size")
    if result.max_concurrency < 1 or result.fresh_instance_share < 1:
        raise EngineError(
            f"engine {who}: max_concurrency and fresh_instance_share are at least 1 "
            f"(got {result.max_concurrency} and {result.fresh_instance_share})"
        )
    return result
