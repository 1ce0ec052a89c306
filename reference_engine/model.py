"""Loading an mlx-vlm model directory, and the forward passes the engine needs.

Everything model-specific lives here: the engine above only sees token ids, embedding rows,
position ids and KV rows. Supported: the Qwen2-VL family as implemented by mlx-vlm (M-RoPE
position ids computed once over the whole prompt, so a suffix prefilled after a cached prefix
gets exactly the position ids the full prompt gets: ``positions.mrope_positions`` for
Qwen2-VL, the model's own ``get_rope_index`` otherwise).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from pytest_prefixcache.errors import EngineError, PrefixCacheError
from pytest_prefixcache.package_data import fixture_model

from .cpu import kv_cache_class, transpose_linears
from .fixtures.qwen2_vl import QWEN2_VL_DIR
from .kv import Window, restore_windows
from .positions import mrope_positions

__all__ = ["LoadedModel", "default_model_path", "load_model"]


class LoadedModel:
    """An mlx-vlm model and its processor, with the primitive operations of a prefill."""

    def __init__(self, model: Any, processor: Any, path: Path) -> None:
        self.model = model
        self.processor = processor
        self.path = path
        config = model.config
        self.image_token_id = int(config.image_token_id)
        self.merge_size = int(config.vision_config.spatial_merge_size)
        self.model_type = str(getattr(config, "model_type", ""))
        eos = getattr(config, "eos_token_id", None)
        self.eos_token_ids = frozenset(
            [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
        )
        lm = model.language_model
        self.num_layers = len(lm.model.layers)
        self.fingerprint = _fingerprint(path)

    @property
    def tokenizer(self) -> Any:
        return getattr(self.processor, "tokenizer", self.processor)

    # -- images ---------------------------------------------------------------------------
    def preprocess(self, pil_image: Any) -> tuple[mx.array, tuple[int, int, int]]:
        """Pixel patches and (t, h, w) patch grid for one image, by the model's processor."""
        out = self.processor.image_processor(images=[pil_image])
        pixels = mx.array(np.asarray(out["pixel_values"]))
        grid = tuple(int(x) for x in np.asarray(out["image_grid_thw"]).reshape(-1)[:3])
        return pixels, (grid[0], grid[1], grid[2])

    def placeholder_count(self, grid: tuple[int, int, int]) -> int:
        t, h, w = grid
        return (t * h * w) // (self.merge_size**2)

    def vision_rows(self, pixels: mx.array, grid: tuple[int, int, int]) -> mx.array:
        """The embedding rows of one image: (placeholder_count(grid), hidden)."""
        tower = self.model.vision_tower
        dtype = tower.patch_embed.proj.weight.dtype
        rows = tower(pixels.astype(dtype), mx.array([list(grid)]), output_hidden_states=False)
        mx.eval(rows)
        return rows

    # -- text -----------------------------------------------------------------------------
    def embed(self, token_ids: Sequence[int]) -> mx.array:
        """Token embeddings, shape (len, hidden)."""
        return self.model.language_model.model.embed_tokens(mx.array(list(token_ids)))

    def positions(
        self, token_ids: Sequence[int], grids: Sequence[tuple[int, int, int]]
    ) -> tuple[mx.array, int]:
        """M-RoPE position ids of the whole prompt, shape (3, 1, L), and the rope delta
        (Qwen2-VL: ``positions.mrope_positions``; other models: their ``get_rope_index``)."""
        if grids and self.model_type == "qwen2_vl":
            pos, delta = mrope_positions(
                token_ids, grids, image_token_id=self.image_token_id, merge_size=self.merge_size
            )
            return mx.array(pos)[:, None, :], delta
        return self.rope_index(token_ids, grids)

    def rope_index(
        self, token_ids: Sequence[int], grids: Sequence[tuple[int, int, int]]
    ) -> tuple[mx.array, int]:
        """``positions`` by the model's own ``get_rope_index`` (mlx-vlm)."""
        ids = mx.array([list(token_ids)])
        lm = self.model.language_model
        if grids:
            pos, delta = lm.get_rope_index(ids, mx.array([list(g) for g in grids]))
            return pos.astype(mx.int32), int(np.asarray(delta).reshape(-1)[0])
        n = len(token_ids)
        return mx.broadcast_to(mx.arange(n, dtype=mx.int32)[None, None, :], (3, 1, n)), 0

    # -- KV -------------------------------------------------------------------------------
    def make_cache(self, capacity: int = 0) -> list[Any]:
        """An empty KV cache; with ``capacity``, its first write allocates room for that many
        positions at once (instead of growing 256 positions at a time, copying every row
        each time it grows). KVCache has no API for that: its growth ``step`` is a class
        attribute, set here per instance. On CPU, mlx-vlm's KVCache handing attention its
        keys transposed (``cpu.py``)."""
        kv_cache = kv_cache_class(transposed=mx.default_device() == mx.cpu)
        cache = [kv_cache() for _ in range(self.num_layers)]
        if capacity > 0:
            for c in cache:
                c.step = _round_up(capacity)
        return cache

    def forward(
        self,
        token_ids: Sequence[int],
        embeds: mx.array,
        cache: list[Any],
        position_ids: mx.array,
        *,
        chunk: int = 256,
        meanwhile: Callable[[], object] | None = None,
        at_last_chunk: Callable[[], object] | None = None,
    ) -> mx.array:
        """Run the language model over ``embeds`` (n, hidden) for ``token_ids`` on top of
        ``cache``, ``chunk`` positions at a time; return the float32 logits of the last
        position, shape (vocab,). The cache advances by n.

        Chunking bounds the attention scores held at once (n x chunk instead of n x n), which
        also makes a long prefill faster; on MLX CPU a split prefill is bit-identical to a
        one-shot one (``benchmarks/chunked_prefill.py``). Only the last position's logits are
        needed, so the last position runs as a step of its own (as mlx-lm's ``generate_step``
        does): every other position only feeds the cache, and MLX, evaluating the cache
        alone, then leaves out the last layer's attention and MLP for them (on the tiny
        fixture that is half the attention). ``meanwhile`` runs while MLX computes the first
        chunk, ``at_last_chunk`` while it computes the last one and the last position (after
        ``meanwhile`` if there is only one): Python work that either leaves MLX alone or
        builds on the cache as the launched chunk leaves it (MLX is lazy: arrays read from
        the cache then are the chunk's results).
        """
        lm = self.model.language_model
        n = len(token_ids)
        if n == 0:
            raise ValueError("forward() needs at least one token")

        def step(s: int, e: int) -> Any:
            return lm(
                mx.array([list(token_ids[s:e])]),
                inputs_embeds=embeds[None, s:e],
                cache=cache,
                position_ids=position_ids[:, :, s:e],
            )

        logits = None
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            if e < n:
                step(s, e)  # its logits are never evaluated
                targets: list[Any] = [c.state for c in cache]
            else:
                if e - s > 1:
                    step(s, n - 1)
                logits = step(n - 1, n).logits[0, -1].astype(mx.float32)
                targets = [[c.state for c in cache], logits]
            work = [meanwhile, at_last_chunk if e == n else None]
            meanwhile = None
            if any(work):
                mx.async_eval(targets)
                for fn in work:
                    if fn is not None:
                        fn()
            mx.eval(targets)
        assert logits is not None
        return logits

    def restore(self, blocks: Sequence[Window], tokens: int, capacity: int = 0) -> list[Any]:
        """A fresh cache holding the first ``tokens`` KV rows of the given blocks' windows in
        order, copied once into a buffer with room for ``capacity`` positions, so that
        appending the suffix and decoding write in place."""
        room = _round_up(max(capacity, tokens)) - tokens
        return restore_windows(self.make_cache, blocks, tokens, capacity, room)

    def greedy(
        self, logits: mx.array, cache: list[Any], prompt_len: int, delta: int, max_new: int
    ) -> tuple[tuple[int, ...], list[np.ndarray]]:
        """Greedy continuation of a prompt of ``prompt_len`` tokens prefilled into ``cache``
        (``delta``: its rope delta), up to ``max_new`` tokens or an end-of-sequence token;
        returns the tokens and the logits before each of them."""
        steps = [np.array(logits)]
        tokens: list[int] = []
        for i in range(max_new):
            token = int(np.argmax(steps[-1]))
            tokens.append(token)
            if token in self.eos_token_ids or i == max_new - 1:
                break
            pos = mx.full((3, 1, 1), prompt_len + i + delta, dtype=mx.int32)
            steps.append(np.array(self.forward([token], self.embed([token]), cache, pos)))
        return tuple(tokens), steps


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
    if "image_token_id" not in config or "vision_config" not in config:
        raise EngineError(
            f"model directory {str(p)!r} is not a vision-language model mlx-vlm can run "
            f"(config.json has no image_token_id or vision_config)"
        )
    from mlx_vlm import load

    try:
        model, processor = load(str(p))
    except Exception as exc:
        raise EngineError(
            f"mlx_vlm could not load {str(p)!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if mx.default_device() == mx.cpu:
        transpose_linears(model.language_model)
    return LoadedModel(model, processor, p)


def default_model_path() -> Path:
    """The tiny Qwen2-VL fixture shipped with the package (a checkout's ``fixtures/``, a
    wheel's ``pytest_prefixcache/fixtures/``); raise EngineError naming the path when missing."""
    try:
        return fixture_model(QWEN2_VL_DIR)
    except PrefixCacheError as exc:
        raise EngineError(str(exc)) from None
