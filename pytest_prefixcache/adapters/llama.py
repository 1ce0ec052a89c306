"""llama.cpp's ``llama-server`` behind the HTTP adapter: the preset and what its flags mean.

Read in llama.cpp's server source (``tools/server/server-context.cpp``, ``server.cpp``,
``common/arg.cpp``; the flags and their reasons are listed in engines/llama/matrix.toml):

- every chat reply carries ``usage.prompt_tokens_details.cached_tokens`` and
  ``timings.cache_n`` (both ``slot.stats.n_prompt_cached``: the prompt tokens the slot did not
  prefill); ``--metrics`` adds the counter ``llamacpp:prompt_tokens_cached_total``: three
  claim sources. ``tokens_cached`` is NOT reuse (the whole prompt);
- logprobs entries carry token ids; each sampled token stays in the slot (its KV computed while
  decoding), so the cache is keyed by prompt + output (``caches_output``);
- ``-np N`` serves N requests at once (slots; ``-1``, the default, is 4 slots with a unified
  KV buffer); a cache-less server is ``--no-cache-prompt --cache-ram 0``;
- cached and cold runs are not bit-identical: flash attention on (``-fa on``/``auto``, the
  default) or a KV cache other than f32 differs (the rule per model family and why:
  :mod:`.llama_tolerance`); ``-fa off`` with an f32 KV cache by ~1e-6 on Llama.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence

from ..errors import EngineError
from .environment import START_TIMEOUT
from .flags import flag_value, split_flags
from .gguf_header import gguf_architecture
from .http.claims import ApiField, ClaimWatch, MetricDelta
from .http.render import TextRenderer, VlmRenderer
from .llama_slots import LlamaServerEngine, lora_scales_of
from .llama_tolerance import LLAMA_ATOL, llama_atol, rule_mode

__all__ = ["ATOL", "CACHE_ONLY", "SPECULATION", "cold_command", "exact_kv", "llama_server", "slots"]

#: The tolerance rule of a family without its own (atol on every decode step's logprobs,
#: greedy tokens equal), by whether the server computes attention exactly enough to be judged
#: tightly: ``"off"`` (``-fa off``, f32 KV) or ``"on"`` (flash attention or an f16/quantized
#: KV cache). Per family: :data:`.llama_tolerance.LLAMA_ATOL`.
ATOL = {"off": LLAMA_ATOL["*", "off"], "on": LLAMA_ATOL["*", "on"]}
#: Flags that only configure the prompt cache, with their number of values: the cold server
#: (which keeps no cache) drops them.
CACHE_ONLY = {
    "--cache-prompt": 0,
    "--no-cache-prompt": 0,
    "--cache-reuse": 1,
    "-cram": 1,
    "--cache-ram": 1,
    "-sps": 1,
    "--slot-prompt-similarity": 1,
    "--cache-idle-slots": 0,
    "--no-cache-idle-slots": 0,
    "--slot-save-path": 1,
}
#: Speculative decoding's flags (a draft model and its settings), with their number of values:
#: the cold server drops them too, so the baseline is the same request decoded without
#: speculation (greedy tokens and every compared step must equal it).
SPECULATION = {
    "-md": 1,
    "--model-draft": 1,
    "--spec-draft-model": 1,
    "--spec-type": 1,
    "--spec-draft-n-max": 1,
    "--spec-draft-n-min": 1,
    "--spec-draft-p-min": 1,
    "--draft-p-min": 1,
}
_NOT_COLD = {**CACHE_ONLY, **SPECULATION}
# Not cache-only: the context checkpoints (-ctxcp, -cms). On a sliding-window model taking a
# checkpoint changes the prefill's logits (by 5.2e-4 on tiny-gemma3-text, engines/llama
# findings), and a cache-less server takes them too, so the cold server keeps the same ones.
_FA = ("-fa", "--flash-attn")
_NP = ("-np", "--parallel")
_KV = {"k": ("-ctk", "--cache-type-k"), "v": ("-ctv", "--cache-type-v")}
#: What the preset adds unless ``flags`` set it: flash attention off and an f32 KV cache, the
#: configuration whose cached and cold runs agree to ~1e-6.
EXACT_ARGS = ("-fa", "off", "--cache-type-k", "f32", "--cache-type-v", "f32")


def slots(words: Sequence[str]) -> int:
    """The number of slots ``-np``/``--parallel`` sets; llama-server's default (``-1``, auto)
    is 4 (server.cpp)."""
    raw = flag_value(words, _NP)
    if raw is None:
        return 4
    try:
        n = int(raw)
    except ValueError:
        raise EngineError(f"-np {raw!r} is not an int") from None
    return 4 if n < 0 else max(n, 1)


def exact_kv(words: Sequence[str]) -> bool:
    """Whether ``words`` (the full command's) give flash attention off and an f32 KV cache,
    the configuration judged by :data:`ATOL` ``"off"``."""
    fa = flag_value(words, _FA)
    k, v = (flag_value(words, _KV[x]) for x in "kv")
    return fa == "off" and k == "f32" and v == "f32"


def cold_command(cmd: Sequence[str]) -> list[str]:
    """The cache-less cold server: ``cmd`` without the cache-only flags and without
    speculative decoding (:data:`SPECULATION`), prompt caching and the RAM prompt cache off;
    the same slots as ``cmd`` (so a wave of concurrent cold requests
    is batched like the cached ones: the waves' noise control), one when ``cmd`` sets none."""
    out: list[str] = []
    skip = 0
    for word in cmd:
        name = word.partition("=")[0]
        if skip:
            skip -= 1
        elif word in _NOT_COLD:
            skip = _NOT_COLD[word]
        elif name in _NOT_COLD:
            continue
        else:
            out.append(word)
    if flag_value(out, _NP) is None:
        out += ["-np", "1"]
    return [*out, "--no-cache-prompt", "--cache-ram", "0"]


def llama_server(
    model: str | os.PathLike[str],
    mmproj: str | os.PathLike[str] | None = None,
    *,
    binary: str = "llama-server",
    atol: float | None = None,
    flash_attn: bool = False,
    extra_args: Sequence[str] = (),
    flags: Sequence[str] = (),
    render_dir: str | os.PathLike[str] | None = None,
    start_timeout: float = START_TIMEOUT,
    audit: bool = True,
    claims: bool = False,
    concurrency: int | None = None,
    slot_save: bool = False,
    restart_flags: Mapping[str, Sequence[str]] | None = None,
    adapters: Mapping[str, Sequence[float]] | None = None,
    base_scales: Sequence[float] | None = None,
) -> LlamaServerEngine:
    """llama.cpp's ``llama-server`` on a GGUF (with ``mmproj``: images, Qwen2-VL), with
    ``flags`` added (a matrix combination: ``-np 2``, ``--cache-reuse 8``, ``-fa on``, ...;
    ``extra_args`` is the same, kept for older callers).

    Cold baseline: a second server that keeps no prompt cache (:func:`cold_command`:
    ``--no-cache-prompt --cache-ram 0``, without the cache-only flags); llama-server has no
    cache reset that empties its RAM prompt cache, so ``reset()`` restarts the cached server.
    Text requests get llama-server's own token ids (``/apply-template`` then ``/tokenize``);
    image requests need ``render_dir`` (a model directory the local renderer reads) for token
    ids and image spans. It has no namespaces.

    Unless ``flags`` set them, flash attention is off and the KV cache f32 (``flash_attn=True``:
    llama.cpp's own defaults instead). Tolerance rule (``atol=None``): :data:`ATOL` ``"off"``
    for flash attention off with an f32 KV cache, ``"on"`` for anything else; logprobs may
    differ by it at every decode step, greedy tokens must agree (the report names the rule).
    A family of :data:`.llama_tolerance.ONE_ROW` (Gemma 4) not in that exact configuration
    runs both servers with ``-ub 1`` under ``--swa-full`` with slots of their own KV (``-np 1``,
    or ``-np N`` without ``-kvu``) and is judged by its ``"ub1"`` rule; otherwise no rule fits
    and it is refused unless ``atol`` is given (:func:`.llama_tolerance.rule_mode`).

    ``concurrency`` (default: the slots ``-np`` gives when ``flags`` set it, else 1): requests
    sent at once (the waves property). ``claims``: read ``cached_tokens``, ``timings.cache_n``
    and the ``llamacpp:prompt_tokens_cached_total`` counter (``--metrics`` is added) around
    every request and compare them with each other (there is no tap); not with concurrency.

    ``slot_save``: the cached server gets ``--slot-save-path`` (a private directory) and the
    engine persists: the restart streams (``--prefixcache-restarts``) save every slot, restart
    it and restore them (:class:`.llama_slots.LlamaServerEngine`). ``restart_flags``: what a
    restart may change and the flags that change it on both servers (``{"weights": ("-m",
    "other.gguf"), "kv_dtype": ("-ctk", "f16", "-ctv", "f16"), "adapter": ("--lora",
    "a.gguf")}``). ``adapters``: ``Request.adapter`` names, each the scale of every
    ``--lora`` in ``flags`` (in order), sent as the request's ``lora`` field; a request
    without an adapter sends none (the server's own scales), or ``base_scales`` when given.
    """
    words = [*split_flags(extra_args), *split_flags(flags)]
    cmd = [*shlex.split(binary), "-m", os.fspath(model), "--host", "127.0.0.1", "--port", "{port}"]
    if mmproj is not None:
        cmd += ["--mmproj", os.fspath(mmproj), "--image-min-tokens", "4"]
        cmd += ["--image-max-tokens", "64"]
    if not flash_attn:
        for name, value in zip(EXACT_ARGS[::2], EXACT_ARGS[1::2], strict=True):
            names = _FA if name == "-fa" else _KV[name[-1]]
            if flag_value(words, names) is None:
                cmd += [name, value]
    if claims:
        cmd.append("--metrics")
    cmd += words
    family = _family(model)
    if atol is None:  # a family judged with -ub 1 gets it on both servers (cold_command)
        rule, one_row = rule_mode(family, exact_kv(cmd), words)
        cmd += one_row
    else:
        rule = "off" if exact_kv(cmd) else "on"
    rule_atol = llama_atol(family, rule)
    if restart_flags and not slot_save:
        raise EngineError("restart_flags without slot_save: nothing outlives a restart")
    loras = sum(w in ("--lora", "--lora-scaled") for w in words)
    scales = lora_scales_of(adapters or {}, loras)
    base = None if base_scales is None else lora_scales_of({"base": base_scales}, loras)["base"]
    slot_dir = None
    if slot_save:
        slot_dir = tempfile.mkdtemp(prefix="prefixcache-llama-slots-")
        cmd += ["--slot-save-path", slot_dir + os.sep]
    if concurrency is None:
        concurrency = slots(words) if flag_value(words, _NP) is not None else 1
    if claims and concurrency > 1:
        raise EngineError(
            f"claims with concurrency={concurrency}: the claim sources are read around one "
            "request at a time; verify the slots without claims"
        )
    watch = None
    if claims:
        sources: list[ApiField | MetricDelta] = [
            ApiField("usage.prompt_tokens_details.cached_tokens"),
            ApiField("timings.cache_n"),
            MetricDelta("llamacpp:prompt_tokens_cached_total", unit="tokens"),
        ]
        watch = ClaimWatch(sources)
    render = None
    if render_dir is not None:
        render = VlmRenderer(render_dir) if mmproj is not None else TextRenderer(render_dir)
    try:
        engine = LlamaServerEngine(
            cmd,
            cold="server",
            cold_cmd=cold_command(cmd),
            top_logprobs=20,
            prompt_ids="tokenize",
            render=render,
            supports_images=mmproj is not None,
            start_timeout=start_timeout,
            atol=rule_atol if atol is None else atol,
            audit=audit,
            claims=watch,
            concurrency=concurrency,
        )
    except BaseException:
        if slot_dir is not None:
            shutil.rmtree(slot_dir, ignore_errors=True)
        raise
    # server-context.cpp: each sampled token joins the slot's prompt.tokens and is decoded in
    # the slot, so the next turn that carries the reply reuses its KV (prompt + output)
    engine.caches_output = True
    engine.slot_dir = slot_dir
    engine.n_slots = slots(words)
    engine.persists = slot_dir is not None
    engine.restart_flags = {k: tuple(split_flags(v)) for k, v in (restart_flags or {}).items()}
    engine.lora_scales = scales
    engine.base_scales = base
    if scales:
        engine.cache = dataclasses.replace(engine.cache, adapters=tuple(scales))
    if atol is None:
        what = {
            "off": "flash attention off, f32 KV",
            "on": "flash attention or f16/q KV",
            "ub1": "flash attention or f16/q KV, -ub 1 on both servers (prefill rows through "
            "the kernels decoding uses)",
        }[rule]
        engine.tolerance_rule = (
            f"llama-server, {family or 'any family'}, {what}: cached and cold runs are not "
            f"bit-identical; atol {rule_atol:g} on every step's logprobs, greedy tokens equal "
            "(adapters/llama_tolerance.py, engines/llama/NOTES.md)"
        )
    return engine


def _family(model: str | os.PathLike[str]) -> str:
    """The GGUF's architecture, or "" when its header cannot be read here (a model the
    server finds elsewhere; the server reports a bad file itself)."""
    try:
        return gguf_architecture(model)
    except EngineError:
        return ""
