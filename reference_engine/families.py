"""What differs between the model families the reference engine serves.

A family answers the model-specific questions of the request path; everything else (keys,
pool, restore, prefill schedule, decode) is the engine's:

- how an image is preprocessed, how many placeholder tokens it expands to, and its embedding
  rows (in the scale the language model's input embeddings have);
- what the chat template writes for an image, and what that becomes in the prompt text;
- the position ids of a prompt (M-RoPE for the Qwen VLMs; none for Gemma, whose language
  model counts positions from its cache);
- the token that starts a turn, so the engine knows where conversations can diverge.

Families: :class:`QwenVL` (mlx-vlm's ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_5``, ``qwen3_5_moe``),
:class:`Gemma3` (``gemma3``) and :class:`Gemma4` (``gemma4``). :func:`family_for` picks one by
``model_type``.

Each layer's cache is of one of three kinds (:func:`layer_kinds`), which decide what a cache
can reuse (DESIGN.md, "Model families"): ``full`` (KVCache: trimmable, token-granular),
``window`` (RotatingKVCache: a ring of the last W positions) and ``recurrent`` (ArraysCache:
one state per sequence). The last two are restored from snapshots only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from pytest_prefixcache.errors import EngineError

from .positions import mrope_positions

__all__ = [
    "FULL",
    "RECURRENT",
    "WINDOW",
    "Family",
    "Gemma3",
    "Gemma4",
    "QwenVL",
    "family_for",
    "layer_kinds",
]

FULL, WINDOW, RECURRENT = "full", "window", "recurrent"

Grid = tuple[int, int, int]


def layer_kinds(cache: Sequence[Any]) -> tuple[str, ...]:
    """The kind of every layer's cache, by its class (mlx-vlm's cache classes and their
    subclasses: ``RotatingKVCache`` -> window, ``ArraysCache`` -> recurrent, other KV caches ->
    full)."""
    kinds = []
    for c in cache:
        names = {k.__name__ for k in type(c).__mro__}
        if "RotatingKVCache" in names:
            kinds.append(WINDOW)
        elif "ArraysCache" in names or "MambaCache" in names:
            kinds.append(RECURRENT)
        elif hasattr(c, "keys") and hasattr(c, "update_and_fetch"):
            kinds.append(FULL)
        else:
            raise EngineError(f"layer cache {type(c).__name__} is of no kind the engine knows")
    return tuple(kinds)


class Family:
    """The model-specific operations of one family (see the module docstring)."""

    name = ""
    #: Position ids are passed to the language model (M-RoPE) or left to it (None).
    has_positions = True

    def __init__(self, model: Any, processor: Any) -> None:
        self.model = model
        self.processor = processor
        config = model.config
        token = getattr(config, "image_token_id", None)
        if token is None:
            token = getattr(config, "image_token_index", None)
        if token is None:
            raise EngineError(f"{self.name}: the config names no image_token_id/image_token_index")
        self.image_token_id = int(token)

    @property
    def tokenizer(self) -> Any:
        return getattr(self.processor, "tokenizer", self.processor)

    def turn_start_id(self) -> int | None:
        """The token id that starts every turn of the chat template, or None."""
        for text in self.turn_tokens:
            tid = self.tokenizer.convert_tokens_to_ids(text)
            unk = getattr(self.tokenizer, "unk_token_id", None)
            if isinstance(tid, int) and tid != unk:
                return tid
        return None

    turn_tokens: tuple[str, ...] = ()

    def header_end_id(self) -> int | None:
        """The token that ends a turn header (a newline, when it is one token), or None."""
        ids = self.tokenizer.encode("\n", add_special_tokens=False)
        return int(ids[0]) if len(ids) == 1 else None

    # -- text ---------------------------------------------------------------------------
    def text_rows(self, rows: mx.array) -> mx.array:
        """Token embedding rows in the scale the language model's ``inputs_embeds`` take."""
        return rows

    def language_ids(self, ids: mx.array) -> mx.array:
        """The token ids handed to the language model next to ``inputs_embeds``."""
        return ids

    # -- images -------------------------------------------------------------------------
    def image_marker(self) -> str:
        """What the chat template writes for one image."""
        return str(self.tokenizer.convert_ids_to_tokens(self.image_token_id))

    def expand_image(self, count: int) -> str:
        """The prompt text an image marker becomes, for an image of ``count`` placeholders."""
        return self.image_marker() * count

    def preprocess(self, pil_image: Any) -> tuple[mx.array, Grid]:
        raise NotImplementedError

    def placeholder_count(self, grid: Grid) -> int:
        raise NotImplementedError

    def vision_rows(self, pixels: mx.array, grid: Grid) -> mx.array:
        raise NotImplementedError

    # -- positions ----------------------------------------------------------------------
    def positions(self, token_ids: Sequence[int], grids: Sequence[Grid]) -> tuple[Any, int]:
        """Position ids of the whole prompt (or None) and the rope delta."""
        return None, 0

    def step_positions(self, position: int) -> Any:
        """Position ids of one decode step at ``position`` (rope delta included), or None."""
        return None


class QwenVL(Family):
    """Qwen2-VL, Qwen2.5-VL and Qwen3.5 (hybrid) as mlx-vlm implements them: a patch grid per
    image, ``t*h*w / merge**2`` placeholders, M-RoPE position ids computed once over the whole
    prompt (``positions.mrope_positions`` for Qwen2-VL, the model's own ``get_rope_index``
    otherwise), so a suffix prefilled after a cached prefix gets the full prompt's ids."""

    name = "qwen-vl"
    turn_tokens = ("<|im_start|>",)

    def __init__(self, model: Any, processor: Any) -> None:
        super().__init__(model, processor)
        self.merge_size = int(model.config.vision_config.spatial_merge_size)
        self.model_type = str(getattr(model.config, "model_type", ""))

    def preprocess(self, pil_image: Any) -> tuple[mx.array, Grid]:
        out = self.processor.image_processor(images=[pil_image])
        pixels = mx.array(np.asarray(out["pixel_values"]))
        grid = tuple(int(x) for x in np.asarray(out["image_grid_thw"]).reshape(-1)[:3])
        return pixels, (grid[0], grid[1], grid[2])

    def placeholder_count(self, grid: Grid) -> int:
        t, h, w = grid
        return (t * h * w) // (self.merge_size**2)

    def vision_rows(self, pixels: mx.array, grid: Grid) -> mx.array:
        tower = self.model.vision_tower
        dtype = tower.patch_embed.proj.weight.dtype
        grid_thw = mx.array([list(grid)])
        if self.model_type in ("qwen2_vl", "qwen2_5_vl"):
            rows = tower(pixels.astype(dtype), grid_thw, output_hidden_states=False)
        else:  # Qwen3-VL-style towers also return the deepstack features (unused by qwen3_5)
            rows, _ = tower(pixels.astype(dtype), grid_thw)
        mx.eval(rows)
        return rows

    def positions(self, token_ids: Sequence[int], grids: Sequence[Grid]) -> tuple[Any, int]:
        if grids and self.model_type == "qwen2_vl":
            pos, delta = mrope_positions(
                token_ids, grids, image_token_id=self.image_token_id, merge_size=self.merge_size
            )
            return mx.array(pos)[:, None, :], delta
        return self.rope_index(token_ids, grids)

    def rope_index(self, token_ids: Sequence[int], grids: Sequence[Grid]) -> tuple[Any, int]:
        """``positions`` by the model's own ``get_rope_index``."""
        ids = mx.array([list(token_ids)])
        lm = self.model.language_model
        if grids:
            pos, d = lm.get_rope_index(ids, mx.array([list(g) for g in grids]))
            return pos.astype(mx.int32), int(np.asarray(d).reshape(-1)[0])
        n = len(token_ids)
        return mx.broadcast_to(mx.arange(n, dtype=mx.int32)[None, None, :], (3, 1, n)), 0

    def step_positions(self, position: int) -> Any:
        return mx.full((3, 1, 1), position, dtype=mx.int32)


class Gemma3(Family):
    """Gemma 3 as mlx-vlm implements it: a SigLIP tower and a projector pooling every image
    to ``mm_tokens_per_image`` soft tokens; the template writes ``<start_of_image>``, which the
    processor expands to ``\\n\\n<start_of_image>`` + soft tokens + ``<end_of_image>\\n\\n``. The
    language model scales its input embeddings by sqrt(hidden), so the image rows are divided
    by it first (as mlx-vlm's ``prepare_inputs_for_multimodal`` does); positions come from the
    cache offset."""

    name = "gemma3"
    has_positions = False
    turn_tokens = ("<start_of_turn>",)

    def __init__(self, model: Any, processor: Any) -> None:
        super().__init__(model, processor)
        config = model.config
        per_image = getattr(config, "mm_tokens_per_image", None) or getattr(
            config.text_config, "mm_tokens_per_image", None
        )
        self.tokens_per_image = int(per_image or 0)
        if self.tokens_per_image <= 0:
            raise EngineError("gemma3: the config has no mm_tokens_per_image")
        self.hidden_size = int(model.config.text_config.hidden_size)

    def image_marker(self) -> str:
        return str(getattr(self.processor, "boi_token", "<start_of_image>"))

    def expand_image(self, count: int) -> str:
        boi = self.image_marker()
        eoi = str(getattr(self.processor, "eoi_token", "<end_of_image>"))
        soft = str(self.tokenizer.convert_ids_to_tokens(self.image_token_id))
        return f"\n\n{boi}{soft * count}{eoi}\n\n"

    def preprocess(self, pil_image: Any) -> tuple[mx.array, Grid]:
        out = self.processor.image_processor(images=[pil_image])
        pixels = mx.array(np.asarray(out["pixel_values"]))
        return pixels, (1, 1, self.tokens_per_image)

    def placeholder_count(self, grid: Grid) -> int:
        return grid[2]

    def vision_rows(self, pixels: mx.array, grid: Grid) -> mx.array:
        dtype = self.model.language_model.model.embed_tokens.weight.dtype
        hidden, _, _ = self.model.vision_tower(
            pixels.transpose(0, 2, 3, 1).astype(dtype), output_hidden_states=True
        )
        rows = self.model.multi_modal_projector(hidden)[0] / (self.hidden_size**0.5)
        mx.eval(rows)
        return rows


class Gemma4(Family):
    """Gemma 4 as mlx-vlm implements it (``models/gemma4``). Its language model takes
    ``inputs_embeds`` as they are (``get_input_embeddings`` scales the token rows by
    sqrt(hidden); image rows are the ``embed_vision`` projection, unscaled) and computes the
    per-layer inputs from the token ids it is given, where ``get_input_embeddings`` puts 0 for
    image tokens (``language_ids``). The template writes the image token, which the processor
    expands to ``<start_of_image>`` + n soft tokens + ``<end_of_image>``, n following the
    image's shape (aspect-ratio preserving resize to at most ``max_soft_tokens``). KV-shared
    layers have no cache entry of their own: ``make_cache`` holds the non-shared layers', and
    the shared layers attend over what their source layer's cache returns, so restoring the
    source layers restores what they read."""

    name = "gemma4"
    has_positions = False
    turn_tokens = ("<start_of_turn>",)

    def __init__(self, model: Any, processor: Any) -> None:
        super().__init__(model, processor)
        self.embed_scale = float(model.language_model.model.embed_scale)

    def text_rows(self, rows: mx.array) -> mx.array:
        return rows * self.embed_scale

    def language_ids(self, ids: mx.array) -> mx.array:
        return mx.where(ids == self.image_token_id, mx.zeros_like(ids), ids)

    def expand_image(self, count: int) -> str:
        boi = str(getattr(self.processor, "boi_token", "<start_of_image>"))
        eoi = str(getattr(self.processor, "eoi_token", "<end_of_image>"))
        return f"{boi}{self.image_marker() * count}{eoi}"

    def preprocess(self, pil_image: Any) -> tuple[mx.array, Grid]:
        data, counts = self.processor.image_processor(images=[pil_image])
        pixels = mx.array(np.asarray(data["pixel_values"]))
        return pixels, (1, 1, int(counts[0]))

    def placeholder_count(self, grid: Grid) -> int:
        return grid[2]

    def vision_rows(self, pixels: mx.array, grid: Grid) -> mx.array:
        rows = self.model.embed_vision(self.model.vision_tower(pixels))[0]
        mx.eval(rows)
        if rows.shape[0] != grid[2]:
            raise EngineError(f"gemma4: the vision tower gave {rows.shape[0]} rows for {grid[2]}")
        return rows


_FAMILIES: dict[str, type[Family]] = {
    "qwen2_vl": QwenVL,
    "qwen2_5_vl": QwenVL,
    "qwen3_5": QwenVL,
    "qwen3_5_moe": QwenVL,
    "gemma3": Gemma3,
    "gemma4": Gemma4,
}


def family_for(model: Any, processor: Any, path: str) -> Family:
    """The family of a loaded mlx-vlm model; EngineError naming the path and the families."""
    model_type = str(getattr(model.config, "model_type", ""))
    cls = _FAMILIES.get(model_type)
    if cls is None:
        raise EngineError(
            f"model directory {path!r}: model_type {model_type!r} is not a family the reference "
            f"engine serves ({', '.join(sorted(_FAMILIES))})"
        )
    return cls(model, processor)
