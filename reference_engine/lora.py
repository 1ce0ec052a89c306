"""LoRA adapters per request: a request names an adapter (``Request.adapter``), the engine runs
its language model with that adapter's low-rank weights added, and keys every block it stores
under the adapter's identity (its name and the sha256 of its files, ``identity.Identity``).

An adapter is a folder in mlx-lm's format (``adapter_config.json`` with ``fine_tune_type:
"lora"`` and ``lora_parameters.scale``, ``adapters.safetensors`` with ``<module>.lora_a`` (in,
r) and ``<module>.lora_b`` (r, out), module paths relative to the language model, e.g.
``model.layers.1.self_attn.q_proj``). Each adapted linear layer of the (shared) model is
wrapped once by an :class:`AdaptedLinear` that holds the fused weights ``W + scale * (lora_a @
lora_b)`` of every adapter loaded on it and picks one by the adapter active in the calling
thread (:func:`active`, a context variable): engines sharing a model never swap weights under
each other, and a request with no adapter runs the base layer, bit for bit the engine without
adapters. A cached and a cold run of one adapter use the same fused weights, so they stay
bit-exact.

``Engine(adapters={"name": DIR})``, or ``PREFIXCACHE_REFERENCE_ADAPTERS`` (``name=DIR``
pairs, comma-separated; a bare ``DIR`` is named by its folder; the folder ``fixture`` is the
model's own fixture adapter, ``fixtures/adapters/<model>-lora``), loads them; ``engine.adapters``
(the trait) lists their names, and the plugin's streams then draw requests with them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from pytest_prefixcache.errors import EngineError

from .compiled_layers import ADAPTER
from .cpu import TransposedLinear
from .model import LoadedModel

__all__ = [
    "ADAPTERS_ENV",
    "FIXTURE",
    "AdaptedLinear",
    "Adapters",
    "Lora",
    "active",
    "adapters_from_env",
    "fixture_adapter",
    "load_lora",
    "parse_adapters",
]

ADAPTERS_ENV = "PREFIXCACHE_REFERENCE_ADAPTERS"
#: The folder value naming the model's own fixture adapter (``fixtures/adapters/<model>-lora``).
FIXTURE = "fixture"
_ACTIVE = ADAPTER  # compiled layers keep a trace per adapter (compiled_layers.py)
_FILES = ("adapter_config.json", "adapters.safetensors")


@dataclass(frozen=True)
class Lora:
    """A loaded adapter: its name, folder, identity (``name@sha256`` of its files) and its
    low-rank pairs by module path (relative to the language model)."""

    name: str
    path: Path
    identity: str
    scale: float
    pairs: Mapping[str, tuple[mx.array, mx.array]]


def fixture_adapter(model_path: Path) -> Path:
    """The fixture adapter of the model in ``model_path`` (``reference_engine.fixtures``)."""
    return Path(model_path).parent / "adapters" / f"{Path(model_path).name}-lora"


def _module(root: nn.Module, dotted: str) -> Any:
    node: Any = root
    for part in dotted.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def load_lora(name: str, path: str | os.PathLike[str], model: LoadedModel) -> Lora:
    """Read the adapter folder ``path`` for ``model``; raise EngineError naming what is wrong."""
    p = Path(path)
    if not name or not isinstance(name, str):
        raise EngineError(f"adapter at {str(p)!r}: its name must be a non-empty str, got {name!r}")
    missing = [f for f in _FILES if not (p / f).is_file()]
    if missing:
        raise EngineError(f"adapter {name!r} at {str(p)!r} has no {', '.join(missing)}")
    try:
        config = json.loads((p / "adapter_config.json").read_text())
        scale = float(config["lora_parameters"]["scale"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EngineError(f"adapter {name!r}: unreadable adapter_config.json: {exc}") from exc
    if config.get("fine_tune_type", "lora") != "lora":
        raise EngineError(
            f"adapter {name!r}: fine_tune_type {config['fine_tune_type']!r} is not lora"
        )
    h = hashlib.sha256()
    for f in _FILES:
        h.update((p / f).read_bytes())
    weights = mx.load(str(p / "adapters.safetensors"))
    assert isinstance(weights, dict)
    lm = model.model.language_model
    pairs: dict[str, tuple[mx.array, mx.array]] = {}
    for key in sorted(k for k in weights if k.endswith(".lora_a")):
        stem = key.removesuffix(".lora_a")
        b = weights.get(f"{stem}.lora_b")
        if b is None:
            raise EngineError(f"adapter {name!r}: {key} has no {stem}.lora_b")
        try:
            layer = _module(lm, stem)
        except (KeyError, IndexError, ValueError):
            raise EngineError(
                f"adapter {name!r}: the language model has no module {stem!r}"
            ) from None
        base = layer.base if isinstance(layer, AdaptedLinear) else layer
        shape = _in_out(base, stem, name)
        a = weights[key]
        if (a.shape[0], b.shape[1]) != shape or a.shape[1] != b.shape[0]:
            raise EngineError(
                f"adapter {name!r}: {stem} lora_a {a.shape} @ lora_b {b.shape} does not fit "
                f"the layer's (in, out) {shape}"
            )
        pairs[stem] = (a, b)
    if not pairs:
        raise EngineError(f"adapter {name!r} at {str(p)!r}: no *.lora_a weights")
    return Lora(name, p, f"{name}@{h.hexdigest()}", scale, pairs)


def _in_out(layer: Any, stem: str, name: str) -> tuple[int, int]:
    if type(layer) is TransposedLinear:
        return tuple(layer.weight_t.shape)  # type: ignore[return-value]
    if type(layer) is nn.Linear:
        out, inp = layer.weight.shape
        return inp, out
    raise EngineError(f"adapter {name!r}: {stem} is a {type(layer).__name__}, not a linear layer")


class AdaptedLinear(nn.Module):
    """A linear layer with the fused weights of each adapter loaded on it, by identity; it
    runs the one :func:`active` names, else the base layer unchanged."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base
        object.__setattr__(self, "fused", {})  # not parameters: the model's own stay as they are

    def add(self, identity: str, a: mx.array, b: mx.array, scale: float) -> None:
        """Fuse ``W + scale * (a @ b)`` once for ``identity`` (a repeat load is a no-op)."""
        fused: dict[str, nn.Module] = self.__dict__["fused"]
        if identity in fused:
            return
        delta = (a.astype(mx.float32) @ b.astype(mx.float32)) * scale  # (in, out)
        base = self.base
        if type(base) is TransposedLinear:
            w = base.weight_t
            layer: nn.Module = TransposedLinear.__new__(TransposedLinear)
            nn.Module.__init__(layer)
            layer.weight_t = mx.contiguous((w.astype(mx.float32) + delta).astype(w.dtype))
        else:
            w = base.weight
            out, inp = w.shape
            layer = nn.Linear(inp, out, bias="bias" in base)
            layer.weight = (w.astype(mx.float32) + delta.T).astype(w.dtype)
        if "bias" in base:
            layer.bias = base.bias
        mx.eval(layer.parameters())
        fused[identity] = layer

    def __call__(self, x: mx.array) -> mx.array:
        identity = _ACTIVE.get()
        layer = self.__dict__["fused"].get(identity) if identity is not None else None
        return (layer or self.base)(x)


def install(lora: Lora, model: LoadedModel) -> None:
    """Wrap each layer ``lora`` adapts (once per model) and fuse its weights there."""
    lm = model.model.language_model
    for stem, (a, b) in lora.pairs.items():
        parent_path, _, leaf = stem.rpartition(".")
        parent = _module(lm, parent_path)
        layer = parent[leaf]
        if not isinstance(layer, AdaptedLinear):
            layer = parent[leaf] = AdaptedLinear(layer)
        layer.add(lora.identity, a, b, lora.scale)


@contextlib.contextmanager
def active(identity: str | None) -> Iterator[None]:
    """Run the calling thread's forwards with the adapter ``identity`` (None: none)."""
    token = _ACTIVE.set(identity)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def parse_adapters(items: Sequence[str], source: str) -> dict[str, str]:
    """``NAME=DIR`` items (a bare DIR is named by its folder) as a dict; raise EngineError
    naming ``source`` (the flag or variable) on a bad one."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = Path(item).name, item
        if not name or not path or name in out:
            raise EngineError(f"{source} {item!r}: expected NAME=DIR with a new, non-empty NAME")
        out[name] = path
    return out


def adapters_from_env() -> dict[str, str]:
    """The adapters ``PREFIXCACHE_REFERENCE_ADAPTERS`` names (``NAME=DIR``, comma-separated;
    ``fixture``: the model's fixture adapter as ``lora``)."""
    raw = os.environ.get(ADAPTERS_ENV, "")
    if raw.strip() == FIXTURE:  # the model's own fixture adapter, named lora
        return {"lora": FIXTURE}
    return parse_adapters([s.strip() for s in raw.split(",") if s.strip()], ADAPTERS_ENV)


class Adapters:
    """The adapters of an ``Engine`` (a mixin): loaded at construction, applied per request."""

    model: LoadedModel
    loras: dict[str, Lora]

    def load_adapters(self, adapters: Mapping[str, str | os.PathLike[str]] | str | None) -> None:
        """Load ``adapters`` (name -> folder; :data:`FIXTURE`: the model's fixture adapter as
        ``lora``; None: ``PREFIXCACHE_REFERENCE_ADAPTERS``)."""
        if adapters == FIXTURE:
            adapters = {"lora": FIXTURE}
        named = adapters_from_env() if adapters is None else dict(adapters)  # type: ignore[arg-type]
        self.loras = {
            name: load_lora(
                name, fixture_adapter(self.model.path) if path == FIXTURE else path, self.model
            )
            for name, path in named.items()
        }
        for lora in self.loras.values():
            install(lora, self.model)

    @property
    def adapters(self) -> tuple[str, ...]:
        """The adapter names a request may carry (the plugin's trait; empty: none)."""
        return tuple(self.loras)

    def adapter_identity(self, adapter: str | None) -> str | None:
        """What the keys of a request with ``adapter`` chain from (``Identity.adapter``)."""
        if adapter is None:
            return None
        lora = self.loras.get(adapter)
        if lora is None:
            raise EngineError(
                f"request adapter {adapter!r} is not loaded; loaded: {sorted(self.loras) or 'none'}"
            )
        return lora.identity

    def adapted(self, adapter: str | None) -> contextlib.AbstractContextManager[None]:
        """The forwards of a request with ``adapter`` run with its weights (:func:`active`)."""
        return active(self.adapter_identity(adapter))
