"""oMLX as PyPI ships it (flyto-mlx 0.7.0, package ``omlx``) behind the HTTP adapter under the
logit tap, with any of its serve flags and settings (``omlx_server``; a matrix ``engine``
config passes a combination as ``flags``).

The server runs ``omlx serve`` in oMLX's own virtual environment (``python``, default
``$OMLX_DIR/venv/bin/python``; ``engines/omlx/install.sh`` makes it) through
:mod:`.omlx_launch` (settings without a flag: ``--setting SECTION.FIELD=VALUE``), on the model
``PREFIXCACHE_MODEL`` names (``--prefixcache-model``), else tiny-llama: oMLX serves every
model folder of ``--model-dir`` under the folder's name, so the model's parent directory is
the model directory and its name the ``model`` field. Its base path (settings, the paged SSD
cache, logs) is ``~/.fmlx`` in the server's private HOME.

What flyto-mlx 0.7.0's source says (read in the installed package):

- The API ignores ``logprobs``: the logits come from the tap. It reports reuse in
  ``usage.prompt_tokens_details.cached_tokens``, sums it in ``GET /api/status``
  ``total_cached_tokens`` (server_metrics.py; no auth without an API key), and logs each
  lookup at debug level (scheduler.py: ``paged cache hit, N tokens in B blocks`` or
  ``partial cache hit, N tokens``): the three claim sources (:func:`claim_specs`).
- The prefix cache is the paged SSD cache (on by default under the base path; ``--no-cache``
  turns it off), optionally fronted by an in-memory hot tier (``--hot-cache-max-size``) or
  replaced by it (setting ``cache.hot_cache_only``). Blocks are whole: 256 tokens
  (``SchedulerConfig.paged_cache_block_size``), aligned to a multiple of a rotating window
  in 512-1024 (sliding-window models), enlarged to 2048 for recurrent hybrids
  (:func:`block_size`). Reuse is judged against that block reference.
- No namespaces: nothing in a request keys the cache besides the model and the prompt.
- The cold baseline is a second server with ``--no-cache`` (mlx-lm's BatchGenerator keeps no
  state across requests); its vision-feature cache stays on (in memory, engine/vlm.py), which
  the baseline audit covers.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import EngineError
from ..package_data import FIXTURES, is_vision_model, model_from_env, resolve_model
from .environment import batch_invariant_from_env, concurrency_from_env, value
from .flags import split_flags
from .http.claims import ClaimWatch, sources_from_specs
from .http.openai import OpenAIEngine
from .http.render import TextRenderer, VlmRenderer
from .tolerances import with_measured_rules

__all__ = [
    "CACHE_ONLY",
    "LAUNCHER",
    "block_size",
    "claim_specs",
    "commands",
    "from_env",
    "omlx_server",
    "requested_block",
    "slug",
]

#: The launcher the tap runs in oMLX's environment (it writes ``--setting`` values first).
LAUNCHER = "pytest_prefixcache.adapters.omlx_launch:main"
#: Flags (and ``--setting`` keys) that only configure the prefix cache, with their number of
#: values: the cold server drops them and gets ``--no-cache``.
CACHE_ONLY = {
    "--paged-ssd-cache-dir": 1,
    "--paged-ssd-cache-max-size": 1,
    "--hot-cache-max-size": 1,
    "--initial-cache-blocks": 1,
    "--block-size": 1,  # the launcher's (omlx_launch.py)
}
CACHE_SETTINGS = ("cache.",)
#: scheduler.py: the default block, the rotating-window target range, the hybrid block.
DEFAULT_BLOCK, ROTATING_MIN, ROTATING_MAX, ARRAYS_BLOCK = 256, 512, 1024, 2048
#: The debug lines of a prefix lookup that found blocks (scheduler.py, ``_schedule_waiting``).
HIT_LOG = r"(?:paged|partial) cache hit, (\d+) tokens"

#: oMLX starts its admin app and engine pool before /health answers
START_TIMEOUT = 300.0


def slug(flags: Sequence[str], model: str | os.PathLike[str] | None = None) -> str:
    """A file name for one combination: ``omlx-tiny-llama--hot-cache-max-size-256MB``."""
    words = [w.lstrip("-").replace("=", "-").replace(".", "-") for w in split_flags(flags)]
    head = "omlx" if model is None else f"omlx-{Path(model).name}"
    return "--".join([head, *words])


def model_dir(model: str | os.PathLike[str] | None = None) -> Path:
    """``model`` (a fixture name or a directory), else ``PREFIXCACHE_MODEL``, else tiny-llama."""
    return model_from_env("tiny-llama") if model is None else resolve_model(model)


def _text_config(model: Path) -> dict[str, Any]:
    try:
        config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot read {model}/config.json: {exc}") from None
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def block_size(model: str | os.PathLike[str], requested: int | None = None) -> int:
    """The paged cache's block size oMLX's scheduler settles on for ``model`` (scheduler.py,
    ``_align_block_size_with_rotating_window`` and ``_enlarge_block_size_for_arrays_cache``):
    the smallest multiple of a sliding window in 512-1024 (the window itself when it is 512 or
    more), at least 2048 for a recurrent hybrid (linear-attention layers), else ``requested``
    (the launcher's ``--block-size``), else 256."""
    text = _text_config(Path(model))
    kinds = set(text.get("layer_types") or ())
    window = text.get("sliding_window")
    if "sliding_attention" in kinds and isinstance(window, int) and window > 0:
        if window >= ROTATING_MIN:
            return window
        size = -(-ROTATING_MIN // window) * window
        return size if size <= ROTATING_MAX else max(window, ROTATING_MAX // window * window)
    if "linear_attention" in kinds:
        return max(ARRAYS_BLOCK, requested or 0)
    return requested or DEFAULT_BLOCK


def requested_block(flags: Sequence[str]) -> int | None:
    """The launcher's ``--block-size N`` among ``flags`` (None when absent)."""
    words = split_flags(flags)
    if "--block-size" not in words:
        return None
    value = (words[words.index("--block-size") + 1 :] or [""])[0]
    if not value.isdigit() or int(value) < 1:
        raise EngineError(f"--block-size {value!r} is not a positive int")
    return int(value)


def default_python() -> str:
    root = value("OMLX_DIR") or str(FIXTURES.parent / ".engines" / "omlx")
    return str(Path(root).resolve() / "venv" / "bin" / "python")  # servers run in their HOME


def commands(flags: Sequence[str], python: str, model: Path) -> tuple[list[str], list[str]]:
    """The cached and the cold server's command lines (the tap launcher, with ``{port}``)."""
    argv = [python, "-m", "pytest_prefixcache.tap", LAUNCHER, "serve"]
    argv += ["--model-dir", str(model.parent), "--host", "127.0.0.1", "--port", "{port}"]
    argv += ["--log-level", "debug"]  # the lookup lines (HIT_LOG) are debug lines
    words = split_flags(flags)
    if "--no-cache" in words:
        raise EngineError("--no-cache is the cold server's flag: the cached server needs a cache")
    cold: list[str] = []
    i = 0
    while i < len(words):
        word, value = words[i], words[i + 1] if i + 1 < len(words) else ""
        if word in CACHE_ONLY:
            i += 1 + CACHE_ONLY[word]
        elif word == "--setting" and value.startswith(CACHE_SETTINGS):
            i += 2
        else:
            cold.append(word)
            i += 1
    return [*argv, *words], [*argv, *cold, "--no-cache"]


def claim_specs() -> list[dict[str, Any]]:
    """Where oMLX reports reuse, as ``PREFIXCACHE_CLAIMS`` JSON objects (see
    :func:`.claims.sources_from_json`): the API's ``cached_tokens``, the change of
    ``/api/status`` ``total_cached_tokens``, and the lookup's debug log line."""
    return [
        {"api": "usage.prompt_tokens_details.cached_tokens"},
        {"stats": "/api/status", "field": "total_cached_tokens", "unit": "tokens"},
        {"log": HIT_LOG, "unit": "tokens"},
    ]


def omlx_server(
    model_dir: str | os.PathLike[str] | None = None,
    flags: Sequence[str] = (),
    *,
    python: str | None = None,
    decode_steps: int = 8,
    start_timeout: float = START_TIMEOUT,
    audit: bool = True,
    claims: bool = True,
    env: Mapping[str, str] | None = None,
    concurrency: int = 1,
) -> OpenAIEngine:
    """oMLX (flyto-mlx 0.7.0) served with ``flags`` under the logit tap, with a ``--no-cache``
    cold server, its claim sources (``claims=False``: none) and the block reference of its
    scheduler, on ``model_dir`` (default: ``PREFIXCACHE_MODEL``, else tiny-llama; images for
    a vision-language model). ``$OMLX_TAP_LOGS``: a directory that gets a JSON-lines file of
    the API's and the tap's reuse per request, ``<slug>.jsonl`` (:func:`slug`). ``env``: more
    environment for both servers (``PYTHONPATH`` entries go after this checkout's).
    ``concurrency``: requests sent at once (above 1 the plugin's waves property runs; the
    server batches up to ``--max-concurrent-requests``); the ``--no-cache`` cold server
    answers the waves' noise control concurrently too. The API returns no logprobs: above 1
    this needs a tap that tells concurrent requests apart."""
    python = python or default_python()
    if not Path(python).is_file():
        raise EngineError(
            f"no oMLX environment at {python}: run 'engines/omlx/install.sh' (OMLX_DIR names where)"
        )
    model = _model_dir(model_dir)
    cmd, cold = commands(flags, python, model)
    logs = value("OMLX_TAP_LOGS")
    images = is_vision_model(model)
    root = str(Path(__file__).resolve().parents[2])  # the launcher imports this checkout
    engine = OpenAIEngine(
        cmd,
        cold="server",
        cold_cmd=cold,
        model=model.name,
        supports_images=images,
        render=VlmRenderer(model) if images else TextRenderer(model),
        tap=True,
        vocab=model,
        env=_server_env(root, env or {}),
        start_timeout=start_timeout,
        timeout=300.0,
        tap_log=str(Path(logs) / f"{slug(flags, model)}.jsonl") if logs else None,
        audit=audit,
        reuse_reference="block",
        block_size=block_size(model, requested_block(flags)),
        claims=ClaimWatch(sources_from_specs(claim_specs()), decode_steps=decode_steps)
        if claims
        else None,
        concurrency=concurrency,
    )
    return with_measured_rules(engine, library="mlx-vlm" if images else "mlx-lm", model_dir=model)


def _server_env(root: str, extra: Mapping[str, str]) -> dict[str, str]:
    paths = [root, *filter(None, extra.get("PYTHONPATH", "").split(os.pathsep))]
    # TMPDIR: what the server leaves in the temp directory goes with its private HOME
    return {**extra, "PYTHONPATH": os.pathsep.join(paths), "TMPDIR": "{home}/tmp"}


_model_dir = model_dir  # omlx_server's parameter of that name hides the function


def from_env() -> OpenAIEngine:
    """``omlx_server`` configured by ``OMLX_FLAGS`` (a command-line string), for
    ``--prefixcache-engine=pytest_prefixcache.adapters.omlx:from_env`` (the model:
    ``--prefixcache-model``); ``PREFIXCACHE_AUDIT=0``: no baseline audit; ``OMLX_CLAIMS=0``:
    no claim sources; ``PREFIXCACHE_CONCURRENCY``: requests sent at once;
    ``PREFIXCACHE_BATCH_INVARIANT``: the trait ``batch_invariant``."""
    audit = value("PREFIXCACHE_AUDIT")
    claims = value("OMLX_CLAIMS")
    flags = shlex.split(value("OMLX_FLAGS"))
    invariant = batch_invariant_from_env()
    engine = omlx_server(
        flags=flags, audit=audit, claims=claims, concurrency=concurrency_from_env()
    )
    engine.batch_invariant = invariant
    return engine
