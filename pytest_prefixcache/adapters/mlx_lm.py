"""mlx-lm in-process: its ``LRUPromptCache`` and prompt-cache generation path, text only.

A request goes the way ``mlx_lm.server`` serves one sequentially (``_serve_single``): the chat
template gives the prompt tokens, ``fetch_nearest_cache((model, namespace), tokens)`` gives a
cache and the tokens still to compute, ``stream_generate(prompt=rest, prompt_cache=cache)``
prefills and decodes greedily, and ``insert_cache`` stores the cache under prompt + generated
tokens. ``use_cache=False`` starts from an empty cache and stores nothing.

``Outcome.logits`` and ``step_logits`` are what ``generate_step`` yields: the log-softmax of
the logits, full vocabulary, float32 (a shift of the logits, so they compare the same way).
At least one token is always generated, as the server does, even for ``max_new_tokens=0``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EngineError
from ..package_data import engine_model
from ..types import Outcome, Request
from .http.chat import add_generation_prompt, text_messages
from .tolerances import split_atol, split_rule

__all__ = ["MlxLmEngine", "tiny_llama"]


class MlxLmEngine:
    """mlx-lm's prompt cache behind the Engine protocol.

    Args:
        model: an mlx-lm model.
        tokenizer: its tokenizer (``TokenizerWrapper`` or Hugging Face tokenizer).
        model_key: the model part of the cache key. Default: ``"model"``.
        max_size: entries ``LRUPromptCache`` keeps. Default: ``10`` (the server's default).
        max_bytes: byte budget of the cache. Default: ``1 << 63``.
        prefill_step_size: tokens per prefill chunk. Default: ``2048``.
    """

    supports_images = False
    supports_namespaces = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_key: str = "model",
        max_size: int = 10,
        max_bytes: int = 1 << 63,
        prefill_step_size: int = 2048,
    ) -> None:
        from mlx_lm.models.cache import LRUPromptCache

        self.model = model
        self.tokenizer = tokenizer
        self.model_key = model_key
        self.max_size = max_size
        self.max_bytes = max_bytes
        self.prefill_step_size = prefill_step_size
        self.prompt_cache = LRUPromptCache(max_size=max_size, max_bytes=max_bytes)
        self._lock = threading.RLock()
        #: mlx-lm's ``generate_step`` computes each yielded token's KV before yielding it, and
        #: ``run`` stores the cache under prompt + every output token.
        self.last_token_kv = True
        #: The measured rule where mlx-lm's own split prefill is not exact (tolerances.py).
        self.atol = split_atol("mlx-lm", str(getattr(model, "model_type", "")))
        self.tolerance_rule = split_rule("mlx-lm", str(getattr(model, "model_type", "")))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], **kwargs: Any) -> MlxLmEngine:
        """Load a model directory with ``mlx_lm.load`` (offline)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from mlx_lm import load

        try:
            loaded: Any = load(str(path))
        except Exception as exc:
            raise EngineError(f"mlx_lm could not load {str(path)!r}: {exc}") from exc
        kwargs.setdefault("model_key", Path(path).name)
        return cls(loaded[0], loaded[1], **kwargs)

    def reset(self) -> None:
        from mlx_lm.models.cache import LRUPromptCache

        with self._lock:
            self.prompt_cache = LRUPromptCache(max_size=self.max_size, max_bytes=self.max_bytes)

    def tokenize(self, request: Request) -> list[int]:
        """The prompt tokens the server would compute for this request."""
        if request.images:
            raise EngineError(
                "the mlx-lm adapter is text only: LRUPromptCache keys on token ids, and every "
                "image expands to the same placeholder ids (use the mlx_vlm_apc adapter)"
            )
        ids = self.tokenizer.apply_chat_template(
            text_messages(request),
            add_generation_prompt=add_generation_prompt(request),
            tokenize=True,
        )
        if isinstance(ids, dict):  # a BatchEncoding from newer tokenizers
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def run(self, request: Request, *, use_cache: bool) -> Outcome:
        from mlx_lm.generate import stream_generate
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.sample_utils import make_sampler

        with self._lock:
            prompt = self.tokenize(request)
            key = (self.model_key, request.namespace)
            cache: Any = None
            rest = prompt
            if use_cache:
                cache, rest = self.prompt_cache.fetch_nearest_cache(key, prompt)
            cached = len(prompt) - len(rest)
            rest = prompt[cached:]
            if cache is None:
                cache = make_prompt_cache(self.model)
            tokens: list[int] = []
            steps: list[np.ndarray] = []
            for resp in stream_generate(
                self.model,
                self.tokenizer,
                prompt=rest,
                max_tokens=max(1, request.max_new_tokens),
                sampler=make_sampler(temp=0.0),
                prompt_cache=cache,
                prefill_step_size=self.prefill_step_size,
            ):
                tokens.append(int(resp.token))
                steps.append(np.array(resp.logprobs, dtype=np.float32).reshape(-1))
            if use_cache:
                self.prompt_cache.insert_cache(key, prompt + tokens, cache)
        if not steps:
            raise EngineError("mlx_lm.stream_generate yielded nothing")
        n = request.max_new_tokens
        return Outcome(
            logits=steps[0],
            tokens=tuple(tokens[:n]),
            step_logits=tuple(steps[: min(n, len(tokens))]),
            cached_tokens=cached,
            prompt_tokens=len(prompt),
            token_ids=tuple(prompt),
            image_spans=(),
            text=str(self.tokenizer.decode(tokens[:n], skip_special_tokens=True)),
        )


def tiny_llama(model_dir: str | os.PathLike[str] | None = None) -> MlxLmEngine:
    """The adapter on ``model_dir`` (a text model's directory or fixture name; default:
    ``PREFIXCACHE_MODEL``, else the shipped tiny Llama fixture); a zero-argument factory. A
    vision-language model is refused (this adapter is text only)."""
    model = engine_model(model_dir, default="tiny-llama", vision=False, who="the mlx-lm adapter")
    return MlxLmEngine.from_pretrained(model)
