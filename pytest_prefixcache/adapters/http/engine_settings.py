""":class:`.openai.OpenAIEngine`'s settings as the Engine protocol and the plugin read them.

The four groups of :mod:`.config` are each field's only home. :class:`EngineSettings` holds
them, derives what is read from the engine itself (``reuse_reference``, ``block_size``,
``supports_namespaces``, the reset endpoints, where prompt token ids come from, the reply's
vocabulary), and refuses a group's field set on the engine (``engine.top_logprobs = 5``): a
copy there would go stale when its group is replaced.
"""

from __future__ import annotations

from typing import cast

from ...errors import EngineError
from .config import FIELDS, Baseline, CacheControl, Process, Readout
from .prompt_ids import PromptIds
from .replies import Vocabulary
from .resets import Endpoint, endpoints

__all__ = ["EngineSettings"]


class EngineSettings:
    """The four groups of settings and what is derived from them (set them in ``__init__``)."""

    baseline: Baseline
    cache: CacheControl
    readout: Readout
    process: Process

    def __setattr__(self, name: str, value: object) -> None:
        if name in FIELDS:  # a copy here would go stale when its group is replaced
            group = FIELDS[name]
            raise AttributeError(
                f"OpenAIEngine.{name} lives in its group: set it with engine.{group} = "
                f"dataclasses.replace(engine.{group}, {name}=...)"
            )
        super().__setattr__(name, value)

    # -- settings the protocol and the plugin read, derived from the groups -----------------
    @property
    def reuse_reference(self) -> str:
        """What the server's cache can reuse by design (``cache.reuse_reference``)."""
        return self.cache.reuse_reference

    @property
    def block_size(self) -> int | None:
        """The block size of ``reuse_reference="block"`` (``cache.block_size``)."""
        return self.cache.block_size

    @property
    def supports_namespaces(self) -> bool:
        """Whether a request's namespace can be sent (a namespace header or body field)."""
        return self.cache.namespace_header is not None or self.cache.namespace_field is not None

    @property
    def adapters(self) -> tuple[str, ...]:
        """The adapter names a request may carry (``cache.adapters``), sent as ``model``."""
        names = self.cache.adapters
        return (names,) if isinstance(names, str) else tuple(names)

    @property
    def returns_prompt_logprobs(self) -> bool:
        """Whether replies carry prompt logprobs (``readout.prompt_logprobs`` asks for them)."""
        return self.readout.prompt_logprobs > 0

    @property
    def decode_kv_probe(self) -> bool:
        """Whether the decode-KV probe can ask this server (:mod:`...verify.decode_kv`): its
        reuse is read from the tap or checked claims."""
        return self.readout.tap or self.readout.claims is not None

    @property
    def resets(self) -> tuple[Endpoint, ...]:
        """The cache-reset endpoints (``cache.reset_paths``, else its method and path)."""
        kv = self.cache
        try:
            return endpoints(kv.reset_paths or f"{kv.reset_method} {kv.reset_path}")
        except ValueError as exc:
            raise EngineError(str(exc)) from None

    @property
    def _prompt_ids(self) -> PromptIds:
        read = self.readout
        return PromptIds(read.prompt_ids, read.render, read.image_token_id)

    @property
    def _vocab(self) -> Vocabulary | None:
        # a directory was read into its Vocabulary when the Readout was made
        return cast("Vocabulary | None", self.readout.vocab)
