"""What each kind of prefill cut costs on the hybrid, and what reuse it buys.

    python benchmarks/hybrid_cuts.py [--repeats N] [--examples N] [--json PATH]

The reference engine cuts every prefill of a model with non-trimmable layers, cold or warm, at
the prompt's boundaries (``reference_engine/snapshots.py``): each cut is a forward call of its
own, and the chunks must be the same on cold and warm runs for the two to be bit-exact. The
kinds of boundary: the turn's start (the template's turn-start token), the newline ending the
turn's header, the position after it (where the content starts; after a reply header only, or
after every turn's header), image edges, multiples of ``GRID``. Five schemes, each a set of
those kinds:

- ``every_kind``: all of them (the engine of ce23718: three cuts a turn);
- ``every_content_start``: turn starts and every turn's content start (the engine of a325bfe:
  two cuts a turn);
- ``engine``: what ``snapshots.boundaries`` gives now: turn starts and the content start after
  each reply header (the generation prompt's: one cut a user turn, two a reply);
- ``no_turn_starts``: the header newline and every content start, no turn start (two a turn);
- ``content_only``: every content start alone (one a turn).

**Cost** (``limit``): on tiny-qwen3.5-vl, the last prompt of ``family_workloads()``'s
growing_chat (1,819 tokens, a 13-turn chat with images), the process CPU time of one uncut
forward (``LoadedModel.forward`` in chunks of 256, the last position alone; with the engine's
gated-delta kernels, ``recurrent.py``, and with mlx-vlm's own) against the engine's cold
request (``Engine.run(use_cache=False)``: render, vision, the cut forward) under
each scheme; medians of ``--repeats`` rounds, each round running every variant once in turn so
that load hits them alike.

**Reuse** (``verify``): the default verification (``pytest --prefixcache-verify``, seed 1,
``--examples``) on tiny-qwen3.5-vl once per scheme, each a subprocess with this file as a
pytest plugin (``-p hybrid_cuts``: it replaces the engine's boundaries by the scheme's, named
by ``HYBRID_CUTS_SCHEME``); per scheme the verdict, the reuse against the token oracle and the
snapshot-aware reference, the worst |cached - uncached| and the CPU time.

Writes ``results/hybrid_cuts.json`` (the load averages before and after each part in it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SCHEMES = ("every_kind", "every_content_start", "engine", "no_turn_starts", "content_only")
MODEL = "tiny-qwen3.5-vl"
ENV = "HYBRID_CUTS_SCHEME"


def scheme_boundaries(scheme: str) -> Callable[..., list[int]]:
    """``snapshots.boundaries`` as ``scheme`` draws them (see the module)."""
    from reference_engine.snapshots import GRID, MAX_HEADER
    from reference_engine.snapshots import boundaries as engine

    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not one of {', '.join(SCHEMES)}")

    def drawn(
        token_ids: Sequence[int],
        spans: Any,
        turn_start_id: int | None,
        header_end_id: Any = None,
        **kw: Any,
    ) -> list[int]:
        if scheme == "engine":
            return engine(token_ids, spans, turn_start_id, header_end_id, **kw)
        found = set(engine(token_ids, spans, turn_start_id, header_end_id))
        n = len(token_ids)
        starts = [i for i, t in enumerate(token_ids) if t == turn_start_id]
        newline = [  # the newline ending each turn's header
            next((j for j in range(t + 1, min(n, t + MAX_HEADER + 1)) if token_ids[j] == end), 0)
            for t in starts
            for end in ([] if header_end_id is None else [header_end_id])
        ]
        kept = {p for s, e, _ in spans for p in (s, e)} | set(range(GRID, n + 1, GRID)) | {n}
        if scheme in ("every_kind", "no_turn_starts"):
            found.update(newline)
        if scheme in ("no_turn_starts", "content_only"):
            found -= set(starts) - kept
        return sorted(p for p in found if 0 < p <= n)

    return drawn


def use_scheme(scheme: str) -> None:
    """Make the engine draw its boundaries by ``scheme`` (every engine in the process)."""
    from reference_engine import resume

    resume.boundaries = scheme_boundaries(scheme)  # type: ignore[attr-defined]


if os.environ.get(ENV):  # loaded as a pytest plugin by ``verify``
    use_scheme(os.environ[ENV])


def cpu(fn: Callable[[], object]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def limit(repeats: int) -> dict[str, Any]:
    """CPU time of the engine's cold request per scheme, against one uncut forward."""
    sys.path.insert(0, str(HERE))
    from workloads import family_workloads

    from pytest_prefixcache.package_data import fixture_model
    from reference_engine import Engine, resume

    engine = Engine.from_pretrained(fixture_model(MODEL))
    request = family_workloads()[0].requests[-1]
    model, prefill = engine.model, engine.prefill
    seen: dict[str, Any] = {}

    def grab(ids: Any, start: int, embeds: Any, cache: Any, positions: Any, **kw: Any) -> Any:
        seen.update(ids=ids, embeds=embeds, positions=positions, cuts=len(kw.get("cuts") or ()))
        return prefill(ids, start, embeds, cache, positions, **kw)

    engine.prefill = grab  # type: ignore[method-assign]
    cuts = {}
    engine_boundaries = resume.boundaries  # type: ignore[attr-defined]
    for scheme in SCHEMES:
        use_scheme(scheme)
        engine.run(request, use_cache=False)  # warms up too
        cuts[scheme] = seen["cuts"]
    engine.prefill = prefill  # type: ignore[method-assign]
    ids = seen["ids"]

    def uncut(kernels: bool) -> Callable[[], None]:
        def run() -> None:
            model.piece_kernels = kernels
            try:
                cache = model.make_cache(len(ids) + 1)
                model.forward(ids, seen["embeds"], cache, seen["positions"])
            finally:
                model.piece_kernels = True

        return run

    times: dict[str, list[float]] = {"uncut": [], "uncut_mlx_vlm": [], **{s: [] for s in SCHEMES}}
    for _ in range(repeats):
        times["uncut"].append(cpu(uncut(True)))
        times["uncut_mlx_vlm"].append(cpu(uncut(False)))
        for scheme in SCHEMES:
            use_scheme(scheme)
            times[scheme].append(cpu(lambda: engine.run(request, use_cache=False)))
    resume.boundaries = engine_boundaries  # type: ignore[attr-defined]
    base, own = (statistics.median(times[x]) for x in ("uncut", "uncut_mlx_vlm"))
    return {
        "prompt_tokens": len(ids),
        "uncut_cpu_s": round(base, 4),
        "uncut_mlx_vlm_kernels_cpu_s": round(own, 4),
        "rows": [
            {
                "scheme": s,
                "cuts": cuts[s],
                "cold_cpu_s": round(statistics.median(times[s]), 4),
                "over_uncut": round(statistics.median(times[s]) / base, 3),
                "over_uncut_mlx_vlm_kernels": round(statistics.median(times[s]) / own, 3),
            }
            for s in SCHEMES
        ],
    }


def verify(scheme: str, examples: int, scratch: Path) -> dict[str, Any]:
    """The default verification on the hybrid with ``scheme``'s boundaries (a subprocess)."""
    report = scratch / f"{scheme}.json"
    cmd = [
        sys.executable, "-m", "pytest", "-p", "hybrid_cuts", "-p", "no:cacheprovider", "-q",
        "--prefixcache-verify", "--pyargs", "pytest_prefixcache.suite",
        "--prefixcache-seed=1", f"--prefixcache-model={MODEL}",
        f"--prefixcache-examples={examples}", "--prefixcache-database=none",
        f"--prefixcache-report={report}", f"--prefixcache-failures-dir={scratch / 'failures'}",
    ]  # fmt: skip
    path = os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, ENV: scheme, "PYTHONPATH": path}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=scratch, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not report.is_file():
        raise SystemExit(f"{scheme}: no report (exit {done.returncode}):\n{done.stdout[-3000:]}")
    r = json.loads(report.read_text())
    return {
        "scheme": scheme,
        "verdict": r["verdict"],
        "requests": r["requests"],
        "reused_tokens": r["reused_tokens"],
        "oracle_tokens": r["oracle_tokens"],
        "snapshot_reused": r["snapshot_reused"],
        "snapshot_tokens": r["snapshot_tokens"],
        "efficiency": r["efficiency"],
        "worst_diff": r["worst_diff"],
        "wall_s": round(wall, 1),
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--examples", type=int, default=20, help="0: no verification")
    parser.add_argument("--json", type=Path, default=RESULTS / "hybrid_cuts.json")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.examples < 0:
        parser.error("--repeats must be at least 1 and --examples at least 0")
    out: dict[str, Any] = {
        "command": "python " + " ".join(["benchmarks/hybrid_cuts.py", *(argv or sys.argv[1:])])
    }
    out["load_before_limit"] = os.getloadavg()
    out["limit"] = limit(args.repeats)
    out["load_after_limit"] = os.getloadavg()
    for row in out["limit"]["rows"]:
        print(
            f"{row['scheme']:16} {row['cuts']:3} cuts  cold {row['over_uncut']:.3f}x uncut "
            f"({row['over_uncut_mlx_vlm_kernels']:.3f}x on mlx-vlm's kernels)"
        )
    if args.examples:
        out["examples"] = args.examples
        out["verify"] = []
        with tempfile.TemporaryDirectory() as scratch:
            for scheme in SCHEMES:
                load = os.getloadavg()
                row = verify(scheme, args.examples, Path(scratch))
                row["load_before"], row["load_after"] = load, os.getloadavg()
                out["verify"].append(row)
                print(
                    f"{scheme:18} {row['verdict']}: reused {row['reused_tokens']:,} of "
                    f"{row['oracle_tokens']:,} (snapshot-aware {row['efficiency']:.1%}), "
                    f"worst {row['worst_diff']}, {row['cpu_s']} s CPU"
                )
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
