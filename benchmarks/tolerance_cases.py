"""What the tolerance measurements (``split_tolerance.py``, ``decode_tolerance.py``) share: a
fixture's language model as the library that serves it loads it, fed chunk by chunk into a
fresh cache and read as the last position's log-softmax; and their measuring loop, seeded
trials per (library, fixture) case combined into one row each, printed as a Markdown table and
written as JSON with the command that produced it.

A script gives its cases, a ``trial(model, rng, vocab)`` that returns one trial's figures, and
the :class:`Column` of each figure (how trials combine, how the table shows it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pytest_prefixcache.package_data import fixture_model

RESULTS = Path(__file__).resolve().parent / "results"

Trial = Callable[[Any, np.random.Generator, int], dict[str, float]]

#: How a figure combines over the trials of a case.
COMBINE: dict[str, Callable[[list[float]], float]] = {
    "worst": lambda values: max(values, default=0.0),
    "smallest": lambda values: min(values, default=float("inf")),
    "count": sum,
}


@dataclass(frozen=True)
class Column:
    """One figure of a row: its JSON ``key``, its table ``header``, how its trials ``combine``
    (a key of :data:`COMBINE`) and its table ``format``."""

    key: str
    header: str
    combine: str
    format: str = ".2e"


def language_model(library: str, fixture: str) -> tuple[Any, str]:
    """The model whose forward the library's servers run, and its model type."""
    path = fixture_model(fixture)
    if library == "mlx-lm":
        from mlx_lm import load

        model = load(str(path))[0]
        return model, str(model.model_type)
    from mlx_vlm import load as vlm_load

    model = vlm_load(str(path))[0]
    return model.language_model, str(model.config.model_type)


def fresh_cache(model: Any) -> list[Any]:
    """An empty cache for ``model``, its per-prompt position state cleared."""
    for attr in ("_position_ids", "_rope_deltas"):  # mlx-vlm's Qwen VLMs keep them per prompt
        if hasattr(model, attr):
            setattr(model, attr, None)
    if hasattr(model, "make_cache"):
        return list(model.make_cache())
    from mlx_vlm.models.cache import KVCache  # mlx-vlm's Qwen2-VL: full attention only

    return [KVCache() for _ in model.layers]


def last_logprobs(out: Any) -> np.ndarray:
    """The last position's log-softmax (float32) of a forward's output."""
    import mlx.core as mx

    logits = getattr(out, "logits", out)[0, -1].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits))


def run(model: Any, chunks: Sequence[Sequence[int]]) -> np.ndarray:
    """Feed ``chunks`` in order into one fresh cache; the last position's log-softmax."""
    import mlx.core as mx

    cache = fresh_cache(model)
    out = None
    for chunk in chunks:
        out = model(mx.array([list(chunk)]), cache=cache)
    return last_logprobs(out)


def measure(
    library: str, fixture: str, trials: int, seed: int, trial: Trial, columns: Sequence[Column]
) -> dict[str, Any]:
    """One case's row: ``trials`` seeded trials combined per column."""
    model, model_type = language_model(library, fixture)
    config = json.loads((fixture_model(fixture) / "config.json").read_text())
    vocab = int(config.get("text_config", config).get("vocab_size", config.get("vocab_size")))
    rng = np.random.default_rng(seed)
    figures = [trial(model, rng, vocab) for _ in range(trials)]
    row: dict[str, Any] = {
        "library": library,
        "fixture": fixture,
        "model_type": model_type,
        "trials": trials,
    }
    for c in columns:
        row[c.key] = COMBINE[c.combine]([f[c.key] for f in figures])
    return row


def main(
    script: str,
    doc: str | None,
    cases: Sequence[tuple[str, str]],
    trial: Trial,
    columns: Sequence[Column],
    argv: list[str] | None = None,
) -> int:
    """The command line of the tolerance ``script`` (its path; ``doc``: its docstring): measure
    every case, print the table, write ``results/<script's name>.json``."""
    name = Path(script).stem
    parser = argparse.ArgumentParser(description=(doc or name).splitlines()[0])
    parser.add_argument("--trials", type=int, default=12, help="prompts per case (default 12)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / f"{name}.json")
    parser.add_argument(
        "--fixtures", default="", help="comma-separated fixtures to measure (default: every case)"
    )
    args = parser.parse_args(argv)
    only = {f for f in args.fixtures.split(",") if f}
    unknown = only - {fix for _, fix in cases}
    if unknown:
        parser.error(f"--fixtures: no case for {', '.join(sorted(unknown))}")
    cases = [(lib, fix) for lib, fix in cases if not only or fix in only]
    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    rows = [measure(lib, fix, args.trials, args.seed, trial, columns) for lib, fix in cases]
    print("| library | fixture | " + " | ".join(c.header for c in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for r in rows:
        figures = " | ".join(format(r[c.key], c.format) for c in columns)
        print(f"| {r['library']} | {r['fixture']} | {figures} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = f"python benchmarks/{name}.py " + " ".join(sys.argv[1:] if argv is None else argv)
    args.out.write_text(json.dumps({"command": command.strip(), "rows": rows}, indent=2) + "\n")
    return 0
