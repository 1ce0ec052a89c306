"""The llama-server lab's engine factory for the matrix (engines/llama/matrix.toml) and the
targeted tests (engines/llama/test_llama_server.py): where the server and the tiny GGUFs are,
and what the random-weight fixtures need on top of the ``llama_server`` preset.

``LLAMA_BINARY``: the server's command line (engines/llama/run.sh sets it: ``nice -n 5`` and
the llama-server it installed or ``LLAMA_SERVER_BIN``); ``LLAMA_MODELS``: the directory
reference_engine/fixtures/gguf_models.py wrote. Importable with engines/llama and tests/ on
``sys.path`` (engines/llama/run.sh puts them there).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.llama import llama_server

__all__ = ["ASCII", "RENDER", "engine"]

HERE = Path(__file__).resolve().parent
RENDER = HERE.parents[1] / "fixtures" / "tiny-qwen2-vl"
#: llama-server drops the logprobs entry of every generated token whose text ends inside a
#: UTF-8 character (server-context.cpp process_token: add_token only for complete text) and
#: the tiny random-weight models often generate such byte tokens; a grammar keeps generation
#: to printable ASCII, so every step has its entry. The logprobs are the raw (pre-sampling)
#: ones, so the sampled token need not be their argmax: the label check is off, and the
#: Outcome's tokens are the sampled ones (``OpenAIEngine.sampled_tokens``).
ASCII = {"grammar": "root ::= [ -~]*"}
MODELS = {
    "text": ("tiny-llama.gguf", None),
    "vl": ("tiny-qwen2-vl.gguf", "tiny-qwen2-vl-mmproj.gguf"),
    # Gemma 3: sliding-window layers (window 32) between full ones, so context checkpoints
    # and --swa-full matter
    "gemma3-text": ("tiny-gemma3-text.gguf", None),
    # Gemma 4 (issue #35): layers 2-3 share the KV of 0-1, per-layer inputs, window 32
    "gemma4-text": ("tiny-gemma4-text.gguf", None),
}
#: tiny-llama's draft model (tiny-llama's tokenizer, fewer layers): ``-md``
DRAFT = "tiny-llama-draft.gguf"
#: tiny-llama's LoRA (the fixtures' PEFT adapter through convert_lora_to_gguf.py)
LORA = "tiny-llama-lora.gguf"
#: tiny-llama with its norms scaled (engines/llama/tuned_gguf.py): another fine-tune of the
#: same shapes, the restart move's weights change
TUNED = "tiny-llama-tuned.gguf"
#: Per-request adapters (``adapters=True``): the LoRA loaded unapplied
#: (``--lora-init-without-apply``: a request without a ``lora`` field is the base model), and
#: two identities over it, each a scale of that one adapter.
ADAPTERS = {"lora": (1.0,), "half": (0.5,)}


def restart_flags(models: Path) -> dict[str, tuple[str, ...]]:
    """What a restart may change on tiny-llama, each a change llama.cpp's slot file cannot
    see in the tokens: the weights (:data:`TUNED`: the same shapes, another fine-tune), the
    KV type (f32 to f16), an adapter (``--lora``, scale 1)."""
    return {
        "weights": ("-m", str(models / TUNED)),
        "kv_dtype": ("-ctk", "f16", "-ctv", "f16"),
        "adapter": ("--lora", str(models / LORA)),
    }


def engine(
    flags: Sequence[str] = (),
    *,
    model: str = "text",
    audit: bool = False,
    claims: bool = True,
    atol: float | None = None,
    concurrency: int | None = None,
    top_logprobs: int = 20,
    draft: bool = False,
    lora: str = "",
    restarts: bool = False,
    changes: Sequence[str] | None = None,
    adapters: bool = False,
    explicit_base: bool = False,
) -> OpenAIEngine:
    """:func:`llama_server` on the lab's ``model`` (``text``: tiny-llama.gguf; ``vl``:
    tiny-qwen2-vl.gguf and its mmproj; ``gemma3-text``: tiny-gemma3-text.gguf) with a matrix
    combination's ``flags``, the ASCII grammar, the label check off. ``claims`` only where
    the combination serves one request at a time (``-np`` above 1 declares that many
    concurrent requests instead: the waves).
    ``audit=False`` by default, as for the other matrices: the cold server keeps no cache and
    every cold reply must report 0 cached tokens.
    ``draft``: speculative decoding with tiny-llama-draft.gguf (``-md``, ``--spec-type
    draft-simple``: without a type the draft model loads and is never used); the cold server
    decodes without it. ``lora``: a LoRA GGUF of the models directory (``--lora``), on both
    servers. ``restarts``: slot files across restarts (``--slot-save-path``), the changes of
    :func:`restart_flags` (tiny-llama only; ``changes``: only those, ``[]`` none).
    ``adapters``: per-request LoRA scales (:data:`ADAPTERS`) over tiny-llama-lora.gguf,
    loaded unapplied on both servers; ``explicit_base``: a request without an adapter sends
    scale 0 instead of no ``lora`` field."""
    models = Path(os.environ.get("LLAMA_MODELS", ".engines/llama/models"))
    gguf, mmproj = MODELS[model]
    flags = list(flags)
    if draft:
        flags += ["-md", shlex.quote(str(models / DRAFT)), "--spec-type", "draft-simple"]
    if lora:
        flags += ["--lora", shlex.quote(str(models / lora))]
    if adapters:
        flags += ["--lora", shlex.quote(str(models / LORA)), "--lora-init-without-apply"]
    e = llama_server(
        models / gguf,
        models / mmproj if mmproj else None,
        binary=os.environ.get("LLAMA_BINARY", "llama-server"),
        atol=atol,
        flags=flags,
        render_dir=RENDER if mmproj else None,
        audit=audit,
        claims=claims and (concurrency or 1) <= 1 and not _parallel(flags),
        concurrency=concurrency,
        slot_save=restarts,
        restart_flags=_changes(restart_flags(models), changes) if restarts else None,
        adapters=ADAPTERS if adapters else None,
        base_scales=(0.0,) if adapters and explicit_base else None,
    )
    if restarts and os.environ.get("LLAMA_SLOT_LOG"):  # what the restarts restored, at exit
        atexit.register(_log_slots, e, os.environ["LLAMA_SLOT_LOG"], list(flags))
    e.readout = dataclasses.replace(e.readout, top_logprobs=top_logprobs, check_labels=False)
    e.extra_body.update(ASCII)
    # the grammar's token is what the server generated and what a closed-loop prompt carries
    # back: the oracle counts the reply's KV through those ids, not the raw argmax
    e.sampled_tokens = True
    return e


def _log_slots(e: OpenAIEngine, path: str, flags: list[str]) -> None:
    counts = getattr(e, "slot_counts", None)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"flags": flags, **(counts or {})}) + "\n")


def _changes(
    flags: dict[str, tuple[str, ...]], names: Sequence[str] | None
) -> dict[str, tuple[str, ...]]:
    """``flags`` limited to ``names`` (None: all of them); an unknown name raises."""
    if names is None:
        return flags
    unknown = sorted(set(names) - set(flags))
    if unknown:
        raise ValueError(f"changes={list(names)!r}: unknown {unknown}; known: {sorted(flags)}")
    return {name: flags[name] for name in names}


def _parallel(flags: Sequence[str]) -> bool:
    """Whether ``flags`` give more than one slot (then the combination runs the waves)."""
    from pytest_prefixcache.adapters.flags import flag_value, split_flags
    from pytest_prefixcache.adapters.llama import slots

    words = split_flags(flags)
    return flag_value(words, ("-np", "--parallel")) is not None and slots(words) > 1
