"""Loading an mlx-vlm model directory, and the forward passes the engine needs.

Everything model-specific lives here and in ``families.py``: the engine above only sees token
ids, embedding rows, position ids, KV rows and the state snapshots of layers that cannot be
trimmed. Families: Qwen2-VL / Qwen2.5-VL (full attention), Qwen3.5 (hybrid: recurrent layers
and full attention) and Gemma 3 (sliding-window layers and global ones), as mlx-vlm implements
them. ``kinds`` says what each layer's cache is (``families.layer_kinds``); only the ``full``
layers' KV rows are stored in blocks, the others are restored from snapshots (``snapshots.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from pytest_prefixcache.errors import EngineError, PrefixCacheError
from pytest_prefixcache.package_data import fixture_model
from pytest_prefixcache.types import Message, Request

from .compiled_layers import compiled_layers
from .compiled_layers import install as install_compiled_layers
from .cpu import kv_cache_class, transpose_linears
from .families import FULL, RECURRENT, Family, family_for, layer_kinds
from .fixtures.qwen2_vl import QWEN2_VL_DIR
from .kv import Window, restore_windows
from .recurrent import PIECE_CHUNK, SEQUENTIAL_UP_TO, sequential_pieces
from .recurrent import install as install_piece_kernels
from .render import render

__all__ = ["LoadedModel", "cache_arrays", "default_model_path", "load_model", "shared_model"]


class LoadedModel:
    """An mlx-vlm model and its processor, with the primitive operations of a prefill."""

    def __init__(self, model: Any, processor: Any, path: Path) -> None:
        self.model = model
        self.processor = processor
        self.path = path
        config = model.config
        self.family: Family = family_for(model, processor, str(path))
        self.image_token_id = self.family.image_token_id
        self.model_type = str(getattr(config, "model_type", ""))
        eos = getattr(config, "eos_token_id", None)
        if eos is None:
            eos = getattr(getattr(config, "text_config", None), "eos_token_id", None)
        self.eos_token_ids = frozenset(
            [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
        )
        lm = model.language_model
        self.num_layers = len(lm.model.layers)
        #: The kind of each layer's cache (``families.FULL``, ``WINDOW``, ``RECURRENT``).
        self.kinds = layer_kinds(lm.make_cache()) if hasattr(lm, "make_cache") else ()
        if not self.kinds:
            self.kinds = (FULL,) * self.num_layers
        #: Indices of the layers whose KV rows are stored in blocks.
        self.full_layers = tuple(i for i, k in enumerate(self.kinds) if k == FULL)
        #: Indices of the layers restored from snapshots only (windows, recurrent states).
        self.stateful_layers = tuple(i for i, k in enumerate(self.kinds) if k != FULL)
        #: The token that starts each turn of the chat template (a snapshot boundary).
        self.turn_start_id = self.family.turn_start_id()
        #: The token that ends a turn header (the turn's content starts after it).
        self.header_end_id = self.family.header_end_id()
        #: The generation prompt's token ids from its turn-start token (a boundary follows it).
        self.reply_header = self._reply_header()
        self.fingerprint = _fingerprint(path)
        #: Recurrent layers run short prefill pieces through the sequential kernel (the same
        #: choice on cold and warm runs: ``recurrent.py``), where mlx-vlm's module allows it.
        self.piece_kernels = RECURRENT in self.kinds and install_piece_kernels()
        #: Recurrent decoder layers run as one compiled call each in the engine's forward, cold
        #: and warm alike (``compiled_layers.py``).
        self.compile_layers = RECURRENT in self.kinds and install_compiled_layers(lm)

    @property
    def tokenizer(self) -> Any:
        return getattr(self.processor, "tokenizer", self.processor)

    # -- images ---------------------------------------------------------------------------
    def preprocess(self, pil_image: Any) -> tuple[mx.array, tuple[int, int, int]]:
        """Pixel values and the patch grid (or the family's stand-in) for one image."""
        return self.family.preprocess(pil_image)

    def placeholder_count(self, grid: tuple[int, int, int]) -> int:
        return self.family.placeholder_count(grid)

    def vision_rows(self, pixels: mx.array, grid: tuple[int, int, int]) -> mx.array:
        """The embedding rows of one image: (placeholder_count(grid), hidden)."""
        return self.family.vision_rows(pixels, grid)

    # -- text -----------------------------------------------------------------------------
    def embed(self, token_ids: Sequence[int]) -> mx.array:
        """Token embeddings, shape (len, hidden)."""
        rows = self.model.language_model.model.embed_tokens(mx.array(list(token_ids)))
        return self.family.text_rows(rows)

    def positions(
        self, token_ids: Sequence[int], grids: Sequence[tuple[int, int, int]]
    ) -> tuple[Any, int]:
        """Position ids of the whole prompt ((3, 1, L) M-RoPE ids, or None where the model
        counts positions from its cache) and the rope delta."""
        return self.family.positions(token_ids, grids)

    def rope_index(
        self, token_ids: Sequence[int], grids: Sequence[tuple[int, int, int]]
    ) -> tuple[Any, int]:
        """``positions`` by the model's own ``get_rope_index`` (mlx-vlm's Qwen VLMs)."""
        rope_index = getattr(self.family, "rope_index", None)
        if rope_index is None:
            raise EngineError(f"{self.model_type} has no M-RoPE position ids")
        return rope_index(token_ids, grids)  # type: ignore[no-any-return]

    def _reply_header(self) -> tuple[int, ...] | None:
        """The token ids the chat template's generation prompt adds, from its turn-start token
        (``<|im_start|>assistant\n``), or None (no turn token, no template, no header)."""
        if self.turn_start_id is None:
            return None
        try:
            ids = render(
                Request((Message("user", ("x",)),)),
                processor=self.processor,
                image_token_id=self.image_token_id,
                placeholder_count=lambda _image: 0,
            ).token_ids
        except Exception:  # a template that cannot render one user turn: the newline rule
            return None
        starts = [i for i, t in enumerate(ids) if t == self.turn_start_id]
        return tuple(ids[starts[-1] :]) if starts and len(ids) - starts[-1] > 1 else None

    # -- KV -------------------------------------------------------------------------------
    @property
    def cpu_layout(self) -> bool:
        """Whether the CPU rewrites of ``cpu.py`` apply: measured bit-identical on the
        full-attention Qwen VLMs; the other families run mlx-vlm's own modules and caches."""
        return (
            mx.default_device() == mx.cpu
            and not self.stateful_layers
            and self.model_type in ("qwen2_vl", "qwen2_5_vl")
        )

    def make_cache(self, capacity: int = 0) -> list[Any]:
        """An empty cache, one entry per layer of the kind the model makes; with
        ``capacity``, the first write of a full-attention layer allocates room for that many
        positions at once (instead of growing 256 positions at a time, copying every row
        each time it grows). KVCache has no API for that: its growth ``step`` is a class
        attribute, set here per instance. On CPU, the full-attention Qwen VLMs get the
        KVCache that hands attention its keys transposed (``cpu.py``)."""
        if self.cpu_layout:
            kv_cache = kv_cache_class(transposed=True)
            cache = [kv_cache() for _ in range(self.num_layers)]
        elif not self.stateful_layers and self.model_type in ("qwen2_vl", "qwen2_5_vl"):
            kv_cache = kv_cache_class(transposed=False)
            cache = [kv_cache() for _ in range(self.num_layers)]
        else:
            cache = list(self.model.language_model.make_cache())
        if capacity > 0:
            for i in self.full_layers:
                cache[i].step = _round_up(capacity)
        return cache

    def forward(
        self,
        token_ids: Sequence[int],
        embeds: mx.array,
        cache: list[Any],
        position_ids: mx.array | None,
        *,
        chunk: int = 256,
        cuts: Sequence[int] | None = None,
        at_cut: Callable[[int], object] | None = None,
        meanwhile: Callable[[], object] | None = None,
        at_last_chunk: Callable[[], object] | None = None,
    ) -> mx.array:
        """Run the language model over ``embeds`` (n, hidden) for ``token_ids`` on top of
        ``cache``; return the float32 logits of the last position, shape (vocab,). The cache
        advances by n.

        Where chunks end: by default every ``chunk`` positions from the first (chunking bounds
        the attention scores held at once, n x chunk instead of n x n, which also makes a long
        prefill faster; on MLX CPU a split prefill of a full-attention model is bit-identical
        to a one-shot one, ``benchmarks/chunked_prefill.py``). With ``cuts`` (positions in
        (0, n), relative to the first), exactly there instead: the engine passes the same
        absolute cut points on a cold run and on a warm one, so that the layers whose kernels
        are sensitive to where a prefill is split do the same arithmetic on both; ``at_cut(e)``
        runs once the chunk ending at ``e`` is computed (the engine snapshots there).

        Only the last position's logits are needed, so without ``cuts`` the last position runs
        as a step of its own (as mlx-lm's ``generate_step`` does): every other position only
        feeds the cache, and MLX, evaluating the cache alone, then leaves out the last layer's
        attention and MLP for them. With ``cuts`` the last chunk runs whole: where it ends is
        then a boundary a longer prompt cuts at too. ``meanwhile`` runs while MLX computes the
        first chunk, ``at_last_chunk`` while it computes the last one and the last position (after
        ``meanwhile`` if there is only one): Python work that either leaves MLX alone or
        builds on the cache as the launched chunk leaves it (MLX is lazy: arrays read from
        the cache then are the chunk's results).
        """
        lm = self.model.language_model
        n = len(token_ids)
        if n == 0:
            raise ValueError("forward() needs at least one token")

        def step(s: int, e: int) -> Any:
            extra = {} if position_ids is None else {"position_ids": position_ids[:, :, s:e]}
            with sequential_pieces(*self.piece_choice), compiled_layers(self.compile_layers):
                return lm(
                    self.family.language_ids(mx.array([list(token_ids[s:e])])),
                    inputs_embeds=embeds[None, s:e],
                    cache=cache,
                    **extra,
                )

        if cuts is None:
            ends = [min(n, s + chunk) for s in range(0, n, chunk)]
        else:
            ends = sorted({e for e in cuts if 0 < e < n} | {n})
        logits = None
        s = 0
        for e in ends:
            if e < n:
                step(s, e)  # its logits are never evaluated
                targets: list[Any] = cache_arrays(cache)
            else:
                if e - s > 1 and cuts is None:
                    step(s, n - 1)
                    s = n - 1
                logits = step(s, n).logits[0, -1].astype(mx.float32)
                targets = [cache_arrays(cache), logits]
            work = [meanwhile, at_last_chunk if e == n else None]
            meanwhile = None
            if any(work):
                mx.async_eval(targets)
                for fn in work:
                    if fn is not None:
                        fn()
            mx.eval(targets)
            if e < n and at_cut is not None and cuts is not None:
                at_cut(e)
            s = e
        assert logits is not None
        return logits

    @property
    def piece_choice(self) -> tuple[int, int]:
        """The longest prefill piece the recurrent layers run sequentially and the chunk of
        the scan above it ((0, 0): mlx-vlm's own choice; ``recurrent.py``)."""
        return (SEQUENTIAL_UP_TO, PIECE_CHUNK) if self.piece_kernels else (0, 0)

    def restore(self, blocks: Sequence[Window], tokens: int, capacity: int = 0) -> list[Any]:
        """A fresh cache whose full-attention layers hold the first ``tokens`` KV rows of the
        given blocks' windows in order, copied once into a buffer with room for ``capacity``
        positions, so that appending the suffix and decoding write in place. The other layers
        are left empty: their state comes from a snapshot (``snapshots.py``)."""
        room = _round_up(max(capacity, tokens)) - tokens
        if not self.stateful_layers:
            return restore_windows(self.make_cache, blocks, tokens, capacity, room)
        cache = self.make_cache(capacity)
        full = [cache[i] for i in self.full_layers]
        restore_windows(lambda _capacity: full, blocks, tokens, capacity, room)
        return cache

    def greedy(
        self,
        logits: mx.array,
        cache: list[Any],
        prompt_len: int,
        delta: int,
        max_new: int,
        between: Callable[[], object] | None = None,
    ) -> tuple[tuple[int, ...], list[np.ndarray]]:
        """Greedy continuation of a prompt of ``prompt_len`` tokens prefilled into ``cache``
        (``delta``: its rope delta), up to ``max_new`` tokens or an end-of-sequence token;
        returns the tokens and the logits before each of them. ``between`` runs before each
        decode step (the engine lets other requests in flight run a phase there)."""
        steps = [np.array(logits)]
        tokens: list[int] = []
        for i in range(max_new):
            token = int(np.argmax(steps[-1]))
            tokens.append(token)
            if token in self.eos_token_ids or i == max_new - 1:
                break
            if between is not None:
                between()
            pos = self.family.step_positions(prompt_len + i + delta)
            steps.append(np.array(self.forward([token], self.embed([token]), cache, pos)))
        return tuple(tokens), steps


def cache_arrays(cache: Sequence[Any]) -> list[mx.array]:
    """Every array of every layer's state (to evaluate; recurrent states may hold None)."""
    out: list[mx.array] = []
    for c in cache:
        state = c.state
        for a in state if isinstance(state, (list, tuple)) else (state,):
            if isinstance(a, mx.array):
                out.append(a)
    return out


def _round_up(n: int, step: int = 256) -> int:
    return max(step, -(-n // step) * step)


def _fingerprint(path: Path) -> str:
    """Identity of a model directory: its config and the names and sizes of its weights."""
    h = hashlib.sha256()
    h.update((path / "config.json").read_bytes())
    for weights in sorted(path.glob("*.safetensors")):
        h.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return h.hexdigest()


def load_model(path: str | os.PathLike[str]) -> LoadedModel:
    """Load an mlx-vlm model directory offline; raise EngineError naming the path."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = Path(path)
    if not (p / "config.json").is_file():
        raise EngineError(f"model directory {str(p)!r} has no config.json")
    try:
        config = json.loads((p / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise EngineError(f"model directory {str(p)!r}: config.json is unreadable: {exc}") from exc
    has_image_token = "image_token_id" in config or "image_token_index" in config
    if not has_image_token or "vision_config" not in config:
        raise EngineError(
            f"model directory {str(p)!r} is not a vision-language model mlx-vlm can run "
            f"(config.json has no image_token_id/image_token_index or no vision_config)"
        )
    from mlx_vlm import load

    try:
        model, processor = load(str(p))
    except Exception as exc:
        raise EngineError(
            f"mlx_vlm could not load {str(p)!r}: {type(exc).__name__}: {exc}"
        ) from exc
    loaded = LoadedModel(model, processor, p)
    if loaded.cpu_layout:
        transpose_linears(model.language_model)
    return loaded


#: Models loaded by :func:`shared_model`, by resolved directory and fingerprint.
_SHARED: dict[tuple[Path, str], LoadedModel] = {}
_SHARED_LOCK = threading.Lock()
#: Attributes mlx-vlm's Qwen VL language models keep between calls (the M-RoPE ids of the
#: last prompt); the engine always passes position ids, and a shared model starts without them.
_CALL_STATE = ("_rope_deltas", "_position_ids")


def shared_model(path: str | os.PathLike[str]) -> LoadedModel:
    """The process's one :func:`load_model` of ``path``: fresh engines share the weights (a
    fresh engine is a fresh cache, not a fresh load). Keyed by the resolved directory and its
    fingerprint (a rebuilt model loads again). The weights are only read; the per-call state
    mlx-vlm keeps on the language model is cleared on every hand-out."""
    p = Path(path)
    if not (p / "config.json").is_file():
        raise EngineError(f"model directory {str(p)!r} has no config.json")
    key = (p.resolve(), _fingerprint(p))
    with _SHARED_LOCK:
        loaded = _SHARED.get(key)
        if loaded is None:
            loaded = _SHARED[key] = load_model(p)
    lm = loaded.model.language_model
    for name in _CALL_STATE:
        if getattr(lm, name, None) is not None:
            setattr(lm, name, None)
    return loaded


def default_model_path() -> Path:
    """The tiny Qwen2-VL fixture shipped with the package (a checkout's ``fixtures/``, a
    wheel's ``pytest_prefixcache/fixtures/``); raise EngineError naming the path when missing."""
    try:
        return fixture_model(QWEN2_VL_DIR)
    except PrefixCacheError as exc:
        raise EngineError(str(exc)) from None
