"""Rendering a request to prompt token ids locally, for servers whose API does not say them.

With the model directory the server serves, the adapter renders each request the way mlx-lm
(chat template, text) or mlx-vlm (processor, image pads expanded) does, and fills
``Outcome.token_ids`` and ``image_spans`` when the length matches the server's
``usage.prompt_tokens`` - which gives the plugin's oracle something to measure reuse against.
Engine packages are imported when a renderer is built, not before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import EngineError
from ...types import Image, Request
from .chat import add_generation_prompt, hf_messages, text_messages

__all__ = ["TextRenderer", "VlmRenderer", "placeholder_runs"]

Spans = tuple[tuple[int, int, str], ...]


def placeholder_runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """Maximal runs [start, end) of ``token`` in ``ids``."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, t in enumerate([*ids, None]):
        if t == token and start is None:
            start = i
        elif t != token and start is not None:
            runs.append((start, i))
            start = None
    return runs


class TextRenderer:
    """Text prompts through the model's chat template (what mlx_lm.server tokenizes)."""

    def __init__(self, model_dir: str | os.PathLike[str]) -> None:
        from transformers import AutoTokenizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.tokenizer = AutoTokenizer.from_pretrained(os.fspath(model_dir))

    def __call__(self, request: Request) -> tuple[list[int], Spans]:
        ids: Any = self.tokenizer.apply_chat_template(
            text_messages(request),
            add_generation_prompt=add_generation_prompt(request),
            tokenize=True,
        )
        if not isinstance(ids, list):  # a BatchEncoding from newer tokenizers
            ids = ids["input_ids"]
        return [int(t) for t in ids], ()


class VlmRenderer:
    """Prompts with images through mlx-vlm's processor (what mlx_vlm.server prepares)."""

    def __init__(self, model_dir: str | os.PathLike[str]) -> None:
        from mlx_vlm.utils import get_model_and_args, load_image_processor, load_processor

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        path = Path(model_dir)
        config = json.loads((path / "config.json").read_text())
        get_model_and_args(config)  # imports the model module: it registers its processor
        # as mlx_vlm.load builds it, without loading any weights
        self.processor = load_processor(path, True, eos_token_ids=config.get("eos_token_id"))
        image_processor = load_image_processor(path)
        if image_processor is not None:
            self.processor.image_processor = image_processor
        # Gemma's config names it image_token_index
        token = config.get("image_token_id", config.get("image_token_index"))
        if token is None:
            raise EngineError(
                f"{str(path)!r}: config.json names no image_token_id or image_token_index"
            )
        self.image_token_id = int(token)
        self.add_special = _add_special_tokens(config["model_type"], self.processor)

    def __call__(self, request: Request) -> tuple[list[int], Spans]:
        from mlx_vlm.utils import prepare_inputs

        owner = self.processor
        if not getattr(owner, "chat_template", None):
            owner = getattr(owner, "tokenizer", owner)
        prompt = owner.apply_chat_template(
            hf_messages(request),
            tokenize=False,
            add_generation_prompt=add_generation_prompt(request),
        )
        images: list[Image] = list(request.images)
        inputs = prepare_inputs(
            self.processor,
            images=[img.to_pil() for img in images] or None,
            prompts=str(prompt),
            image_token_index=self.image_token_id,
            add_special_tokens=self.add_special,
        )
        ids = [int(t) for t in np.asarray(inputs["input_ids"]).reshape(-1)]
        runs = placeholder_runs(ids, self.image_token_id)
        return ids, tuple((s, e, img.digest) for (s, e), img in zip(runs, images))


def _add_special_tokens(model_type: str, processor: Any) -> bool:
    """Whether mlx-vlm's tokenization adds markers outside the chat template: its own
    ``should_add_special_tokens`` (mlx-vlm 0.6.12 on); before it, the rule the server inlined
    (mlx-vlm 0.6.7 server/generation.py ``_cpu_preprocess``: Gemma 3, 3n and 4 add none when
    their processor has a chat template)."""
    try:
        from mlx_vlm.utils import should_add_special_tokens
    except ImportError:  # mlx-vlm < 0.6.12 (the public record runs those)
        owns = model_type in ("gemma3", "gemma3n", "gemma4", "gemma4_unified")
        return not owns or getattr(processor, "chat_template", None) is None
    return bool(should_add_special_tokens(model_type, processor))
