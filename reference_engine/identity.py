"""What a persisted block was computed under: the identity its key chains from.

A block's KV rows depend on the model's weights, on the token ids the tokenizer and chat
template produced, and on the dtype (and bits) the rows are kept in; with adapters and tenant
salts, on those too. In memory all of these are fixed for the life of an engine; on disk they
are not: a restart may load other weights, another template or another KV dtype over the same
directory. So the root of every key chain (``blocks.namespace_root``) hashes an
:class:`Identity` with every field, and a restart with one thing changed looks up keys that
nothing before it stored (bug-zoo class 25: SGLang #33268 left the KV dtype out of its disk
keys, #26747 the salt).

The model digest hashes the bytes of ``config.json`` and every ``*.safetensors`` file (not
their names and sizes: a fine-tune of the same shape has the same sizes); the tokenizer digest
hashes the tokenizer and template files and the chat template the processor actually uses.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx.utils import tree_flatten

__all__ = ["Identity", "identity_of", "kv_dtype_of", "model_digest", "tokenizer_digest"]

#: Files of a model directory whose bytes decide the token ids (tokenizer, chat template).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "chat_template.json",
    "chat_template.jinja",
)

_DIGESTS: dict[tuple[Path, tuple[tuple[str, int, int], ...]], str] = {}


@dataclass(frozen=True)
class Identity:
    """Everything a stored block's rows depend on besides its tokens and images.

    Attributes:
        model: sha256 of the weights' bytes (:func:`model_digest`).
        tokenizer: sha256 of the tokenizer and chat template (:func:`tokenizer_digest`).
        kv_dtype: the dtype of the KV rows (``"float32"``, ``"float16"``...).
        kv_bits: bits of a quantized KV cache (None: not quantized).
        adapter: the adapter's identity (None: no adapter).
        salt: a cache salt or tenant that scopes every key ("" : none).
    """

    model: str
    tokenizer: str
    kv_dtype: str
    kv_bits: int | None = None
    adapter: str | None = None
    salt: str = ""

    @property
    def digest(self) -> str:
        """sha256 over every field, length-prefixed (a field's absence is a field too)."""
        h = hashlib.sha256(b"pytest-prefixcache/identity/v1")
        for value in (
            self.model,
            self.tokenizer,
            self.kv_dtype,
            "" if self.kv_bits is None else str(self.kv_bits),
            "\0none" if self.adapter is None else self.adapter,
            self.salt,
        ):
            raw = value.encode("utf-8")
            h.update(struct.pack("<Q", len(raw)) + raw)
        return h.hexdigest()

    def changed(self, other: Identity) -> list[str]:
        """The fields that differ from ``other`` (for messages)."""
        return [
            name
            for name in ("model", "tokenizer", "kv_dtype", "kv_bits", "adapter", "salt")
            if getattr(self, name) != getattr(other, name)
        ]


def _hash_files(files: list[Path], extra: bytes = b"") -> str:
    """sha256 of the files' names and bytes, cached by (name, size, mtime)."""
    stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    key = (files[0].parent.resolve() if files else Path("."), stamp)
    digest = _DIGESTS.get(key) if not extra else None
    if digest is None:
        h = hashlib.sha256()
        for f in files:
            name = f.name.encode()
            h.update(struct.pack("<Q", len(name)) + name)
            with f.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        h.update(extra)
        digest = h.hexdigest()
        if not extra:
            _DIGESTS[key] = digest
    return digest


def model_digest(path: Path) -> str:
    """sha256 of ``config.json`` and the bytes of every ``*.safetensors`` file in ``path``."""
    return _hash_files([path / "config.json", *sorted(path.glob("*.safetensors"))])


def tokenizer_digest(path: Path, processor: Any) -> str:
    """sha256 of the tokenizer and template files of ``path`` and of the chat template the
    processor (or its tokenizer) holds in memory."""
    files = [path / name for name in TOKENIZER_FILES if (path / name).is_file()]
    tokenizer = getattr(processor, "tokenizer", processor)
    templates = [
        str(getattr(owner, "chat_template", None) or "") for owner in (processor, tokenizer)
    ]
    return _hash_files(files, "\0".join(templates).encode("utf-8") + b"\0template")


def kv_dtype_of(model: Any) -> str:
    """The dtype the language model computes (and so keeps its KV rows) in: its embedding's."""
    lm = model.model.language_model
    for item in tree_flatten(lm.parameters()):
        dtype = str(getattr(item[1], "dtype", ""))
        if "float" in dtype:
            return dtype.removeprefix("mlx.core.")
    return "unknown"


def identity_of(model: Any, *, adapter: str | None = None, salt: str = "") -> Identity:
    """The identity of a loaded model (``model.LoadedModel``) as it runs now."""
    return Identity(
        model=model_digest(model.path),
        tokenizer=tokenizer_digest(model.path, model.processor),
        kv_dtype=kv_dtype_of(model),
        kv_bits=None,
        adapter=adapter,
        salt=salt,
    )
