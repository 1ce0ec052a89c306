"""Command-line options of pytest-prefixcache (``pytest --help``, group "prefixcache")."""

from __future__ import annotations

import pytest

from ..output.streams import FAILURES_DIR
from . import settings, targets

DEFAULTS = settings.Settings()

__all__ = ["pytest_addoption"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("prefixcache", "prefix-cache verification (pytest-prefixcache)")
    add = group.addoption
    add(
        "--prefixcache-verify",
        action="store_true",
        default=False,
        help="Add the built-in prefix-cache verification suite to the session",
    )
    add(
        "--prefixcache-engine",
        type=targets.named_engine,
        action="append",
        default=None,
        metavar="[NAME=]MODULE:ATTR",
        help="Engine under test: an Engine instance or a zero-argument callable returning one "
        f"(default: ini prefixcache_engine, else {settings.DEFAULT_ENGINE}); repeat it for "
        "several configurations (named NAME, else after ATTR)",
    )
    add(
        "--prefixcache-model",
        type=settings.model_dir,
        default=None,
        metavar="NAME|DIR",
        help="Model every engine factory loads: a shipped fixture's name (tiny-qwen2-vl, "
        "tiny-llama, ...) or a model directory; exported as PREFIXCACHE_MODEL (default: ini "
        "prefixcache_model, else $PREFIXCACHE_MODEL, else each engine's own fixture)",
    )
    add(
        "--prefixcache-matrix",
        default=None,
        metavar="FILE",
        help="Verify every engine configuration of a matrix file (TOML: [[config]] tables "
        "with name, engine or server_cmd, and a product over [config.flags]; see the README)",
    )
    add(
        "--prefixcache-config",
        action="append",
        default=None,
        metavar="NAME",
        help="Run only this configuration (repeatable; a base name selects all its flag "
        "combinations)",
    )
    add(
        "--prefixcache-examples",
        type=settings.positive_int,
        default=DEFAULTS.examples,
        metavar="N",
        help=f"Examples per property (default: {settings.DEFAULT_EXAMPLES}; the state machine runs "
        f"half as many, {settings.STATEFUL_STEPS} steps each)",
    )
    add(
        "--prefixcache-seed",
        type=settings.seed,
        default=None,
        metavar="S",
        help="Seed for the generated streams (default: random, printed in the header)",
    )
    add(
        "--prefixcache-report",
        default=None,
        metavar="PATH",
        help="Write a JSON report: requests, hits, reuse vs oracle, worst difference, failures",
    )
    add(
        "--prefixcache-timeout",
        type=settings.positive_float,
        default=DEFAULTS.timeout,
        metavar="SECONDS",
        help="Fail an engine call that takes longer, and treat the engine as dead "
        f"(default: {DEFAULTS.timeout:g})",
    )
    add(
        "--prefixcache-atol",
        type=settings.non_negative_float,
        default=DEFAULTS.atol,
        metavar="X",
        help="Absolute tolerance for cached vs uncached logits (default: 0, exact)",
    )
    add(
        "--prefixcache-rtol",
        type=settings.non_negative_float,
        default=DEFAULTS.rtol,
        metavar="X",
        help="Relative tolerance for cached vs uncached logits (default: 0, exact)",
    )
    add(
        "--prefixcache-kl",
        type=settings.non_negative_float,
        default=None,
        metavar="X",
        help="Use the top-k/KL rule instead: estimated KL per step at most X and top tokens "
        "agreeing (for GPU engines and top_logprobs-only engines)",
    )
    add(
        "--prefixcache-min-efficiency",
        type=settings.fraction,
        default=None,
        metavar="F",
        help="Fail when a stream reuses less than F of what the oracle says was reusable",
    )
    add(
        "--prefixcache-min-speedup",
        type=settings.positive_ratio,
        default=None,
        metavar="X",
        help="Fail when a stream's cache hits are not X times faster than their cold runs",
    )
    add(
        "--prefixcache-isolation",
        action="store_true",
        default=False,
        help="Add the timing side-channel test: time to first token must not reveal another "
        "namespace's cached prefix (KS test; implies --prefixcache-verify)",
    )
    add(
        "--prefixcache-replay",
        default=None,
        metavar="PATH",
        help="Replay exactly the stream saved at PATH (a stream.json or its directory)",
    )
    add(
        "--prefixcache-server-cmd",
        type=targets.named_server_cmd,
        action="append",
        default=None,
        metavar="[NAME=]CMD",
        help="Verify an OpenAI-compatible server started from CMD ({port} is replaced by an "
        "ephemeral port on 127.0.0.1); more settings by PREFIXCACHE_* variables (see "
        "pytest_prefixcache.adapters.presets.from_env); repeatable, as --prefixcache-engine",
    )
    add(
        "--prefixcache-server-body",
        type=settings.server_body,
        default=None,
        metavar="JSON",
        help="With --prefixcache-server-cmd: a JSON object of fields added to every request "
        "body (e.g. '{\"return_tokens_as_token_ids\": true}'; PREFIXCACHE_EXTRA_BODY)",
    )
    add(
        "--prefixcache-shards",
        type=settings.positive_int,
        default=None,
        metavar="N",
        help="Split the generated tests into N shards, each with its own seed derived from "
        "--prefixcache-seed and examples/N examples (default: one per pytest-xdist worker)",
    )
    add(
        "--prefixcache-database",
        type=settings.database_spec,
        default=None,
        metavar="DIR|URL|none",
        help="Hypothesis example database, replayed first: a directory, a redis://HOST:PORT/DB "
        "URL shared by many machines, or none (default: $PREFIXCACHE_DATABASE, else "
        f"{settings.DEFAULT_DATABASE})",
    )
    add(
        "--prefixcache-budget",
        type=settings.positive_float,
        default=None,
        metavar="SECONDS",
        help="Keep generating new rounds of examples (fresh seeds) until SECONDS of wall time "
        "are spent; a round in progress finishes (default: one round)",
    )
    add(
        "--prefixcache-progress",
        type=settings.non_negative_float,
        default=DEFAULTS.progress,
        metavar="SECONDS",
        help="Print requests done, hits and failures so far every SECONDS "
        f"(0: never; default: {DEFAULTS.progress:g})",
    )
    add(
        "--prefixcache-failures-dir",
        default=None,
        metavar="DIR",
        help=f"Save failing streams (stream.json and images) under DIR (default: {FAILURES_DIR})",
    )
    add(
        "--prefixcache-allow-partial",
        action="store_true",
        default=False,
        help="Pass even when some correctness check could not run on every request (the "
        "verdict says PASS (partial) and names them); without it such a run exits 1",
    )
    add(
        "--prefixcache-strict-render",
        action="store_true",
        default=False,
        help="Fail on render-hygiene findings (a next turn that re-renders the history, "
        "requests that differ only in volatile bytes); by default they are reported",
    )
    parser.addini("prefixcache_engine", "Engine under test as MODULE:ATTR", default=None)
    parser.addini(
        "prefixcache_model",
        "Model every engine factory loads: a fixture name or a directory (relative to the "
        "ini file)",
        default=None,
    )
