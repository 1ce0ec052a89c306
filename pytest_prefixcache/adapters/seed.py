"""The seed engines, vllm-mlx 0.6.0 and its fork rapid-mlx 0.16.10, behind the HTTP adapter
under the logit tap, with any of their serve flags (``seed_server``; a matrix ``engine``
config passes its flag combination as ``flags``).

The server runs the engine's CLI in its own virtual environment (``python``, default
``$SEED_DIR/<engine>/bin/python``; ``engines/seed/run.sh install`` makes them) on the model
``PREFIXCACHE_MODEL`` names (``--prefixcache-model``), else the tiny fixtures: tiny-qwen2-vl
with ``--mllm``, else tiny-llama (a vision-language model with ``--mllm``, a text one without:
the other kind is refused). The cold baseline is a second server
with the same flags minus those that only configure the prefix cache (:data:`CACHE_ONLY`), plus
``--disable-prefix-cache``, reset before every uncached run (vllm-mlx's simple engine ignores
that flag). Every request is checked against the engine's own claims of reuse
(:func:`claim_sources`: stats endpoints, Prometheus counters, log lines, the API's
``cached_tokens``) and, where the API returns logprobs (rapid-mlx), every decode step's
distribution against the tap's (``decode_steps`` tokens per request).

What the engines' sources say about each flag (read in the installed packages) is in README.md,
"The seed engines"; facts about installing them are in ../shared/NOTES.md.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import EngineError
from ..package_data import FIXTURES, engine_model
from .environment import audit_share, batch_invariant_from_env, concurrency_from_env, value
from .flags import split_flags
from .http.baselines import Cold
from .http.claims import ClaimWatch, sources_from_specs
from .http.openai import OpenAIEngine
from .http.render import TextRenderer, VlmRenderer
from .http.resets import RESTART
from .hub_alias import alias_env, launcher
from .tolerances import with_measured_rules

__all__ = [
    "CACHE_ONLY",
    "ENGINES",
    "claim_specs",
    "cold_baseline",
    "commands",
    "from_env",
    "model_dir",
    "seed_server",
    "slug",
]

#: engine -> (CLI function, cache resets "METHOD /path"). rapid-mlx 0.16.10's DELETE /v1/cache
#: clears only mlx-vlm's multimodal caches (with a text model it answers 200 with {"error":
#: MLX_VLM} and keeps the prefix cache); POST /v1/cache/clear empties the prefix cache.
#: vllm-mlx 0.6.0's DELETE /v1/cache clears every engine cache (prefix store, system-prompt KV,
#: the MLLM cache: its reply's ``engine_cache``), then answers the same error because mlx-vlm
#: 0.7.10 has no ``clear_multimodal_kv_cache`` (its DELETE /v1/cache/prefix leaves the simple
#: engine's MLLM cache). That error is tolerated; the tap catches a reset that leaves reuse
#: behind (an uncached run that reuses is a fault).
MLX_VLM = "Cache clear not available (mlx_vlm not loaded)"
ENGINES = {
    "vllm-mlx": ("vllm_mlx.cli:main", "DELETE /v1/cache"),
    "rapid-mlx": ("rapid_mlx.cli:main", "POST /v1/cache/clear, DELETE /v1/cache"),
}
#: Flags that only configure the prefix cache, with their number of values: the cold server
#: drops them (rapid-mlx refuses --use-paged-cache without the prefix cache).
CACHE_ONLY = {
    "--use-paged-cache": 0,
    "--paged-cache-block-size": 1,
    "--no-memory-aware-cache": 0,
    "--prefix-cache-index": 1,
    "--kv-cache-quantization": 0,
    "--kv-cache-min-quantize-tokens": 1,
    "--mllm-media-prefix-cache": 1,
}
#: The counters behind vllm-mlx 0.6.0's /v1/cache/stats ``engine_cache``, by engine path.
_VLLM_STATS = {
    "simple": "engine_cache.system_kv_cache.counters",  # the non-streaming path never looks
    "simple-mllm": "engine_cache.mllm_cache",
    "batched": "engine_cache",  # memory-aware, legacy and paged stores alike
    "batched-mllm": "engine_cache.prefix_cache",
}

#: seed engines load mlx-lm/mlx-vlm and their own scheduler: starts took up to 2 min on 2 busy cores
START_TIMEOUT = 300.0


def slug(engine: str, flags: Sequence[str]) -> str:
    """A file name for one combination: ``vllm-mlx--continuous-batching--use-paged-cache``."""
    return "--".join([engine, *(w.lstrip("-") for w in split_flags(flags))]) or engine


def model_dir(flags: Sequence[str], model: str | os.PathLike[str] | None = None) -> Path:
    """The model the server loads: ``model`` (a fixture name or a directory), else
    ``PREFIXCACHE_MODEL``, else tiny-qwen2-vl with ``--mllm`` and tiny-llama without; a
    vision-language model with ``--mllm``, a text-only one without."""
    mllm = "--mllm" in split_flags(flags)
    who = "the seed engines " + ("with --mllm" if mllm else "without --mllm (text only)")
    default = "tiny-qwen2-vl" if mllm else "tiny-llama"
    return engine_model(model, default=default, vision=mllm, who=who)


_model_for = model_dir  # seed_server's parameter of that name hides the function


def default_python(engine: str) -> str:
    root = value("SEED_DIR") or str(FIXTURES.parent / ".engines" / "seed")
    return str(Path(root) / engine / "bin" / "python")


def commands(
    engine: str,
    flags: Sequence[str],
    python: str,
    model: Path | None = None,
    tap: bool = True,
    cli: str | None = None,
    metrics: bool = True,
    served_as: str | None = None,
) -> tuple[list[str], list[str]]:
    """The cached and the cold server's command lines (the tap launcher, with ``{port}``; with
    ``tap=False`` the CLI module itself) on ``model`` (default: :func:`model_dir`); ``cli``: the
    CLI function (``module:function``) when it is not the engine's (:data:`ENGINES`);
    ``metrics=False``: no ``--enable-metrics`` (vllm-mlx before 0.2.9 has no such flag);
    ``served_as``: a hub repository id the server is given instead of the model's directory,
    which :mod:`.hub_alias` lays out first (the environment: ``hub_alias.alias_env``)."""
    if engine not in ENGINES:
        raise EngineError(f"seed engine {engine!r} is not one of {sorted(ENGINES)}")
    words = split_flags(flags)
    cli = cli or ENGINES[engine][0]
    launch = ["-m", "pytest_prefixcache.tap", cli] if tap else ["-m", cli.partition(":")[0]]
    directory = model or model_dir(flags)
    start = launcher(python, served_as, directory) if served_as else [python]
    argv = [*start, *launch, "serve"]
    argv += [served_as or str(directory), "--host", "127.0.0.1", "--port", "{port}"]
    cold: list[str] = []
    skip = 0
    for word in words:
        if skip:
            skip -= 1
        elif word in CACHE_ONLY:
            skip = CACHE_ONLY[word]
        else:
            cold.append(word)
    if engine == "vllm-mlx" and metrics:  # its /metrics answers 404 unless asked for
        argv.append("--enable-metrics")
    return [*argv, *words], [*argv, *cold, "--disable-prefix-cache"]


def claim_specs(engine: str, flags: Sequence[str]) -> list[dict[str, Any]]:
    """Where the engine reports reuse with these flags, as ``PREFIXCACHE_CLAIMS`` JSON objects
    (see :func:`.claims.sources_from_json`). Stats fields are optional: the cold server's stats
    have none (``null``). A ``misses`` counter is declared only where every request looks the
    cache up (else a request that never looked would read as a claimed hit); the
    ``[schedule] ... N cached`` log line only on the text schedulers (the MLLM schedulers write
    none, and no line reads as a claim of 0)."""
    words = split_flags(flags)
    mllm = "--mllm" in words
    if engine == "rapid-mlx":  # one engine path: batched
        specs: list[dict[str, Any]] = [{"api": "usage.prompt_tokens_details.cached_tokens"}]
        status = "cache"
        specs += [{"metric": "rapid_mlx_prefix_cache_tokens_saved_total", "unit": "tokens"}]
        specs += [{"metric": "rapid_mlx_prefix_cache_hits_total", "unit": "hits"}]
        stats_path = "/v1/status"
        looks_every_time = not mllm
        log = r"\[schedule\].*tokens_to_prefill=\d+, (\d+) cached" if not mllm else ""
    else:
        batched = "--continuous-batching" in words
        status = _VLLM_STATS[("batched" if batched else "simple") + ("-mllm" if mllm else "")]
        specs = [{"metric": "vllm_mlx_cache_tokens_saved", "unit": "tokens"}]
        stats_path = "/v1/cache/stats"
        looks_every_time = batched and not mllm
        log = r"\[schedule\].*tokens_to_prefill=\d+, (\d+) cached" if looks_every_time else ""
    stats = [("hits", "hits")]  # the system-prompt KV counters count no tokens
    stats += [] if status.endswith("counters") else [("tokens_saved", "tokens")]
    stats += [("misses", "misses")] if looks_every_time else []
    for field, unit in stats:
        specs.append({"stats": stats_path, "field": f"{status}.{field}", "unit": unit})
        specs[-1]["optional"] = True
    if log:
        specs.append({"log": log, "unit": "tokens"})
    return specs


def seed_server(
    engine: str = "vllm-mlx",
    flags: Sequence[str] = (),
    *,
    model_dir: str | os.PathLike[str] | None = None,
    python: str | None = None,
    decode_steps: int = 8,
    top_logprobs: int = 10,
    start_timeout: float = START_TIMEOUT,
    audit: bool = True,
    claims: bool = True,
    audit_share: int = 8,
    concurrency: int = 1,
    tap: bool = True,
    cli: str | None = None,
    resets: str | None = None,
    metrics: bool = True,
    served_as: str | None = None,
) -> OpenAIEngine:
    """``engine`` (``vllm-mlx`` or ``rapid-mlx``) served with ``flags`` under the logit tap,
    with a cache-less cold server, its claim sources and per-step alignment on
    (``decode_steps`` tokens asked for under the tap), on ``model_dir`` (default:
    ``PREFIXCACHE_MODEL``, else the tiny fixture for ``flags``, see :func:`model_dir`).
    ``$SEED_TAP_LOGS``: a directory that gets a JSON-lines file of the API's and the tap's
    reuse per request, ``<slug>.jsonl`` for each combination (:func:`slug`). ``claims=False``:
    no claim sources and no per-step alignment (the tap still gives the logits and the reuse,
    and the API's ``cached_tokens`` is still checked against it): for a run that must get past
    replies whose logprobs miss steps (rapid-mlx 0.16.10 on tiny-qwen3.5: 4 entries for 8
    generated tokens where the text held undecodable bytes), which the claims check fails on a
    stream's first request. The baseline audit's fresh server (15-40 s to start) answers up to
    ``audit_share`` audited requests that share nothing (``SEED_AUDIT_SHARE`` in
    :func:`from_env`).

    ``concurrency``: requests sent at once (above 1 the plugin's waves property runs; batch
    flags such as ``--max-num-seqs`` only matter then). The cold server then answers the
    waves' noise control concurrently too, without resets (``cold="server"``: its
    ``--disable-prefix-cache`` keeps it cache-less), except where the flag is not enough: the
    simple vllm-mlx engine ignores it and the MLLM lanes keep other caches, so there the cold
    server is reset before every uncached run and serves them one at a time. ``tap=False``:
    no logit tap (nor claims, which read the tap): the logits are the API's ``top_logprobs``
    and the reuse its ``cached_tokens``, which only rapid-mlx returns (vllm-mlx returns
    neither). ``cli``: the CLI function when it is not the engine's own (rapid-mlx 0.12 ships
    its CLI as ``vllm_mlx.cli:main``: engines/history runs such versions); ``resets``: the
    cache resets when not the engine's (``"restart"``: a restart empties the cache, where the
    endpoints do not, as in rapid-mlx 0.12); ``metrics=False``: vllm-mlx without
    ``--enable-metrics`` (before 0.2.9; its Prometheus counter is then no claim source);
    ``served_as``: the hub repository id the servers load the model under (:mod:`.hub_alias`:
    the fixture's files, offline), for an engine that decides by the model's name (rapid-mlx's
    alias profiles)."""
    python = python or default_python(engine)
    if not Path(python).is_file():
        raise EngineError(
            f"no {engine} environment at {python}: run 'engines/seed/run.sh install "
            f"{engine}' (SEED_DIR names where)"
        )
    model = _model_for(flags, model_dir)
    cmd, cold = commands(
        engine, flags, python, model, tap=tap, cli=cli, metrics=metrics, served_as=served_as
    )
    specs = [spec for spec in claim_specs(engine, flags) if metrics or "metric" not in spec]
    logs = value("SEED_TAP_LOGS")
    tap_log = str(Path(logs) / f"{slug(engine, flags)}.jsonl") if logs else None
    root = str(Path(__file__).resolve().parents[2])  # the launcher imports this checkout
    images = "--mllm" in split_flags(flags)
    if not tap and engine == "vllm-mlx":
        raise EngineError("vllm-mlx returns no logprobs and no cached_tokens: it needs the tap")
    engine_ = OpenAIEngine(
        cmd,
        # the cache-less server, reset before every run all the same (one at a time): the
        # simple engine ignores --disable-prefix-cache and keeps its MLLM cache
        cold=cold_baseline(engine, flags, concurrency, restarts=resets == RESTART),
        cold_cmd=cold,
        model=served_as or str(model),  # the name the server was given
        top_logprobs=top_logprobs,
        reset_paths=resets or ENGINES[engine][1],
        reset_tolerated=(MLX_VLM,),
        supports_images=images,
        render=VlmRenderer(model) if images else TextRenderer(model),
        tap=tap,
        vocab=model,
        # rapid-mlx leaves rapid-mlx-videos-* directories in the temp directory: in HOME
        env={"PYTHONPATH": root, "TMPDIR": "{home}/tmp", **(alias_env() if served_as else {})},
        start_timeout=start_timeout,
        timeout=300.0,
        tap_log=tap_log,
        audit=audit,
        # rapid-mlx sends a whole request through its prefix cache at start on hybrid and
        # sliding-window models (server.py: "Hybrid model: running full request warmup"):
        # its boundary snapshot after the first token was reused by the first stream
        warm_start=engine == "rapid-mlx",
        claims=ClaimWatch(sources_from_specs(specs), decode_steps=decode_steps)
        if claims and tap
        else None,
        concurrency=concurrency,
    )
    # the measured rule where the library's own split prefill is not exact on the family
    # (mlx-vlm's qwen3_5, a last token run alone on gemma3; measured on mlx-lm 0.32.2 and
    # mlx-vlm 0.7.10, the seed engines pin mlx-lm 0.31.3 and mlx-vlm 0.7.10 / 0.7.2)
    engine_.fresh_instance_share = audit_share
    return with_measured_rules(engine_, library="mlx-vlm" if images else "mlx-lm", model_dir=model)


def cold_baseline(
    engine: str, flags: Sequence[str], concurrency: int, restarts: bool = False
) -> Cold:
    """``"server"`` (the cache-less server as it is, concurrent requests and all) where its
    ``--disable-prefix-cache`` leaves it nothing to reuse and requests go out concurrently, or
    where only a restart would reset it (``restarts``: a restart per uncached run, 20-180 s
    each, is no baseline; the tap faults any reuse on it all the same); else ``"reset"`` (reset
    before every uncached run, which then go one at a time)."""
    words = split_flags(flags)
    simple = engine == "vllm-mlx" and "--continuous-batching" not in words
    keeps_nothing = not simple and "--mllm" not in words
    return "server" if (concurrency > 1 or restarts) and keeps_nothing else "reset"


def from_env() -> OpenAIEngine:
    """``seed_server`` configured by ``SEED_ENGINE`` and ``SEED_FLAGS`` (a command-line string),
    for ``--prefixcache-engine=pytest_prefixcache.adapters.seed:from_env`` (one combination;
    ``engines/seed/matrix.toml`` names them all); ``PREFIXCACHE_AUDIT=0``: no baseline audit;
    ``SEED_CLAIMS=0``: no claim sources; ``PREFIXCACHE_CONCURRENCY``: requests sent at once;
    ``SEED_TAP=0``: no logit tap (rapid-mlx only; see :func:`seed_server`);
    ``PREFIXCACHE_BATCH_INVARIANT``: the trait ``batch_invariant``."""
    engine = value("SEED_ENGINE")
    if not engine:
        raise EngineError("set SEED_ENGINE (vllm-mlx or rapid-mlx) and SEED_FLAGS")
    audit = value("PREFIXCACHE_AUDIT")
    claims = value("SEED_CLAIMS")
    flags = shlex.split(value("SEED_FLAGS"))
    share = audit_share("SEED_AUDIT_SHARE")
    tap = value("SEED_TAP")
    invariant = batch_invariant_from_env()
    server = seed_server(
        engine,
        flags,
        audit=audit,
        claims=claims,
        audit_share=share,
        concurrency=concurrency_from_env(),
        tap=tap,
    )
    server.batch_invariant = invariant
    return server
