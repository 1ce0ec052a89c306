"""mlx-vlm in-process with Automatic Prefix Caching (``mlx_vlm.apc``), images included.

A request is rendered by the processor's chat template and served by
``mlx_vlm.stream_generate(model, processor, prompt, image=[...], apc_manager=...,
apc_tenant=namespace)``, greedily; the generator is always consumed to the end, since APC
stores blocks only then. ``use_cache=False`` passes ``apc_manager=None``: a cold prefill that
neither reads nor writes the cache.

Two modes:

- ``"block"`` (APC's default): chained 16-token blocks in memory.
- ``"snapshot"``: the exact-snapshot tier (what ``APC_LAYER_MAJOR_MEMORY_MIN_TOKENS`` selects):
  one layer-major prompt-cache snapshot per prompt, looked up by exact token prefix.

The disk tier is always off, so nothing is written under ~/.cache. ``Outcome.logits`` and
``step_logits`` are the log-softmax the generator yields, full vocabulary, float32.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..errors import EngineError
from ..package_data import engine_model
from ..types import Outcome, Request
from .http.chat import add_generation_prompt, hf_messages
from .http.render import placeholder_runs
from .tolerances import split_atol, split_rule

__all__ = ["MlxVlmApcEngine", "tiny_qwen2_vl", "tiny_qwen2_vl_snapshot"]

Mode = Literal["block", "snapshot"]


class MlxVlmApcEngine:
    """mlx-vlm's APC behind the Engine protocol.

    Args:
        model: an mlx-vlm model.
        processor: its processor.
        mode: ``"block"`` or ``"snapshot"``. Default: ``"block"``.
        block_size: APC block size. Default: ``16``.
        num_blocks: blocks in APC's pool. Default: ``2048``.
        snapshot_min_tokens: smallest prompt stored as a snapshot in ``"snapshot"`` mode.
            Default: ``16``.
        namespace: the APC disk namespace (unused with the disk tier off). Default: ``"tiny"``.
    """

    supports_images = True
    supports_namespaces = True

    def __init__(
        self,
        model: Any,
        processor: Any,
        *,
        mode: Mode = "block",
        block_size: int = 16,
        num_blocks: int = 2048,
        snapshot_min_tokens: int = 16,
        namespace: str = "tiny",
    ) -> None:
        if mode not in ("block", "snapshot"):
            raise ValueError(f"mode {mode!r} is not 'block' or 'snapshot'")
        self.model = model
        self.processor = processor
        self.mode = mode
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.snapshot_min_tokens = snapshot_min_tokens
        self.namespace = namespace
        config = model.config  # Gemma's config names it image_token_index
        self.image_token_id = int(
            getattr(config, "image_token_id", None) or config.image_token_index
        )
        #: The measured rule where mlx-vlm's own split prefill is not exact (tolerances.py).
        self.atol = split_atol("mlx-vlm", str(config.model_type))
        self.tolerance_rule = split_rule("mlx-vlm", str(config.model_type))
        self._lock = threading.RLock()
        self.manager = self._make_manager()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], **kwargs: Any) -> MlxVlmApcEngine:
        """Load a model directory with ``mlx_vlm.load`` (offline)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from mlx_vlm import load

        try:
            model, processor = load(str(path))
        except Exception as exc:
            raise EngineError(f"mlx_vlm could not load {str(path)!r}: {exc}") from exc
        kwargs.setdefault("namespace", Path(path).name)
        return cls(model, processor, **kwargs)

    def _make_manager(self) -> Any:
        from mlx_vlm import apc

        manager = apc.from_env(
            model_namespace=self.namespace,
            overrides={
                "enabled": True,
                "disk_enabled": False,
                "disk_path": "",
                "block_size": self.block_size,
                "num_blocks": self.num_blocks,
            },
        )
        if manager is None or manager.disk is not None:
            raise EngineError("mlx_vlm.apc.from_env did not give a memory-only APC manager")
        # APCManager reads this one from the environment only; the attribute is what
        # APC_LAYER_MAJOR_MEMORY_MIN_TOKENS sets (0 turns the snapshot tier off).
        manager._layer_major_memory_min_tokens = (
            self.snapshot_min_tokens if self.mode == "snapshot" else 0
        )
        return manager

    def reset(self) -> None:
        with self._lock:
            self.manager.clear()
            self.manager.reset_stats()

    def stats(self) -> dict[str, Any]:
        """APC's own counters (``stats_snapshot()``)."""
        return dict(self.manager.stats_snapshot())

    # -- the request path -------------------------------------------------------------------
    def prompt(self, request: Request) -> str:
        owner = (
            self.processor
            if getattr(self.processor, "chat_template", None)
            else (getattr(self.processor, "tokenizer", self.processor))
        )
        text = owner.apply_chat_template(
            hf_messages(request),
            tokenize=False,
            add_generation_prompt=add_generation_prompt(request),
        )
        return str(text)

    def token_ids(self, prompt: str, images: list[Any]) -> list[int]:
        """The prompt's token ids as mlx-vlm prepares them (image pads expanded)."""
        from mlx_vlm.utils import prepare_inputs, should_add_special_tokens

        inputs = prepare_inputs(
            self.processor,
            images=images or None,
            prompts=prompt,
            image_token_index=self.image_token_id,
            add_special_tokens=should_add_special_tokens(
                self.model.config.model_type, self.processor
            ),
        )
        return [int(t) for t in np.asarray(inputs["input_ids"]).reshape(-1)]

    def run(self, request: Request, *, use_cache: bool) -> Outcome:
        from mlx_vlm import stream_generate

        images: Any = [img.to_pil() for img in request.images]
        prompt = self.prompt(request)
        tokens: list[int] = []
        steps: list[np.ndarray] = []
        cached: int | None = None
        prompt_tokens: int | None = None
        with self._lock:
            for res in stream_generate(
                self.model,
                self.processor,
                prompt,
                image=images or None,
                max_tokens=max(1, request.max_new_tokens),
                temperature=0.0,
                apc_manager=self.manager if use_cache else None,
                apc_tenant=(request.namespace or None) if use_cache else None,
            ):
                cached = int(res.cached_tokens)
                prompt_tokens = int(res.prompt_tokens)
                if res.token is None or res.logprobs is None:
                    continue
                lp = np.array(res.logprobs, dtype=np.float32).reshape(-1)
                if res.token_ids:  # the closing summary: adds only a stop token never yielded
                    if len(res.token_ids) > len(tokens):
                        tokens.append(int(res.token_ids[-1]))
                        steps.append(lp)
                    continue
                tokens.append(int(res.token))
                steps.append(lp)
            ids = self.token_ids(prompt, images)
        if not steps:
            raise EngineError("mlx_vlm.stream_generate yielded no logprobs")
        spans = tuple(
            (start, end, img.digest)
            for (start, end), img in zip(placeholder_runs(ids, self.image_token_id), request.images)
        )
        n = request.max_new_tokens
        return Outcome(
            logits=steps[0],
            tokens=tuple(tokens[:n]),
            step_logits=tuple(steps[: min(n, len(tokens))]),
            cached_tokens=cached,
            prompt_tokens=prompt_tokens,
            token_ids=tuple(ids),
            image_spans=spans,
            text=str(
                getattr(self.processor, "tokenizer", self.processor).decode(
                    list(tokens[:n]), skip_special_tokens=True
                )
            ),
        )


def _model(model_dir: str | os.PathLike[str] | None) -> Path:
    return engine_model(
        model_dir, default="tiny-qwen2-vl", vision=True, who="the mlx-vlm APC adapter"
    )


def tiny_qwen2_vl(model_dir: str | os.PathLike[str] | None = None) -> MlxVlmApcEngine:
    """APC block mode on ``model_dir`` (a vision-language model's directory or fixture name;
    default: ``PREFIXCACHE_MODEL``, else the shipped tiny Qwen2-VL); a zero-argument factory."""
    return MlxVlmApcEngine.from_pretrained(_model(model_dir), mode="block")


def tiny_qwen2_vl_snapshot(model_dir: str | os.PathLike[str] | None = None) -> MlxVlmApcEngine:
    """APC exact-snapshot mode on ``model_dir`` (as :func:`tiny_qwen2_vl`); a zero-argument
    factory."""
    return MlxVlmApcEngine.from_pretrained(_model(model_dir), mode="snapshot")
