"""How many of the default suite's generated streams are closed-loop, and how many of those
actually send the engine's own reply back (a ``ReplyOf`` marker in some request).

    python benchmarks/closed_loop_share.py --seeds 20 --examples 100

Each seed runs the strategy ``test_request_streams`` uses (``request_streams`` with the
suite's own arguments for an engine with images and namespaces, ``closed_loop`` at
``CLOSED_LOOP_SHARE`` or ``--shares``) under the suite's Hypothesis settings, ``@seed(s)`` for
s in 0..N-1, ``--examples`` examples each, no example database: the streams a default run at
that seed generates. No engine runs.

A closed-loop stream is told from an open-loop one by its token counts: the script asks for
``reply_tokens=(3, 8)`` instead of ``(2, 8)``, so every request of a closed-loop stream asks for
3 or more new tokens and every request of an open-loop one for at most 2 (``max_new_tokens``).
A mixed share maps the counts after the stream's last draw, so this moves no draw.

Prints one line per share: streams, closed-loop streams, streams that send a reply back,
requests, requests that carry a reply (what the ``closed loop`` coverage row counts).

    python benchmarks/closed_loop_share.py --shrink 20

With ``--shrink N``: what the smallest failing stream looks like at the default share, for
seeds 0..N-1 and three failure conditions that need no reply (a failure at the first stream
with an assistant turn, with three requests, with two namespaces), as ``o``/``C`` (open- or
closed-loop) and its length: shrinking must still reach open-loop, short streams."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from pytest_prefixcache.strategies import CLOSED_LOOP_SHARE, request_streams, stream_kwargs
from pytest_prefixcache.types import Request
from pytest_prefixcache.verify.closed_loop import markers

#: Reply tokens that tell a closed-loop stream (every request >= 3) from an open-loop one
#: (every request <= the default max_new_tokens, 2).
REPLY_TOKENS = (3, 8)


def measure(share: float, seeds: int, examples: int) -> dict[str, Any]:
    """The counts over ``seeds`` seeds of ``examples`` streams each."""
    kwargs = stream_kwargs(object())  # an engine that supports everything
    kwargs.update(closed_loop=share, reply_tokens=REPLY_TOKENS)
    streams = request_streams(**kwargs)
    counts = dict.fromkeys(("streams", "closed", "replied", "requests", "reply_requests"), 0)
    per_seed = []
    start = time.perf_counter()
    for s in range(seeds):
        before = dict(counts)

        @seed(s)
        @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
                  phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(stream=streams)
        def collect(stream: tuple[Request, ...]) -> None:
            replies = [bool(markers(r)) for r in stream]
            counts["streams"] += 1
            counts["closed"] += all(r.max_new_tokens >= REPLY_TOKENS[0] for r in stream)
            counts["replied"] += any(replies)
            counts["requests"] += len(stream)
            counts["reply_requests"] += sum(replies)

        collect()
        per_seed.append({k: counts[k] - before[k] for k in ("streams", "closed", "replied")})
    row: dict[str, Any] = {"share": share, "seeds": seeds, "examples": examples, **counts}
    row["replied_share"] = round(counts["replied"] / max(1, counts["streams"]), 3)
    row["closed_share"] = round(counts["closed"] / max(1, counts["streams"]), 3)
    row["wall_s"] = round(time.perf_counter() - start, 1)
    row["per_seed"] = per_seed
    return row


#: Failure conditions that need no reply sent back: what shrinking should reach open-loop.
CONDITIONS = {
    "assistant turn": lambda s: any(m.role == "assistant" for r in s for m in r.messages),
    "three requests": lambda s: len(s) >= 3,
    "two namespaces": lambda s: len({r.namespace for r in s}) >= 2,
}


def smallest(
    streams: st.SearchStrategy[tuple[Request, ...]],
    condition: Callable[[tuple[Request, ...]], bool],
    seed_value: int,
) -> tuple[Request, ...]:
    """The smallest stream that meets ``condition`` (300 examples at a seed, then shrinking)."""
    last: list[tuple[Request, ...]] = []

    @seed(seed_value)
    @settings(max_examples=300, database=None, deadline=None, report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(stream=streams)
    def fails(stream: tuple[Request, ...]) -> None:
        if condition(stream):
            last.append(stream)
            raise AssertionError

    try:
        fails()
    except AssertionError:
        pass
    return last[-1]  # Hypothesis replays the shrunk example last


def shrinks(seeds: int) -> dict[str, list[str]]:
    """Per condition, ``o``/``C`` (open- or closed-loop) and the length of the smallest
    stream at each seed."""
    streams = request_streams(closed_loop=CLOSED_LOOP_SHARE, max_images_per_message=0)
    out: dict[str, list[str]] = {}
    for name, condition in CONDITIONS.items():
        out[name] = []
        for s in range(seeds):
            found = smallest(streams, condition, s)
            closed = any(markers(r) or r.max_new_tokens > 2 for r in found)
            out[name].append(f"{'C' if closed else 'o'}{len(found)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shares", type=float, nargs="+", default=[CLOSED_LOOP_SHARE])
    ap.add_argument("--seeds", type=int, default=20, help="Seeds 0..N-1")
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--json", type=Path, help="Write the figures to this JSON file")
    ap.add_argument("--shrink", type=int, metavar="N", help="Shrink at seeds 0..N-1 instead")
    args = ap.parse_args(argv)
    if args.shrink:
        for name, shapes in shrinks(args.shrink).items():
            print(f"{name}: {' '.join(shapes)}")
        return 0
    rows = [measure(share, args.seeds, args.examples) for share in args.shares]
    for r in rows:
        print(
            f"share {r['share']}: {r['streams']} streams, {r['closed']} closed-loop "
            f"({r['closed_share']:.0%}), {r['replied']} send a reply back "
            f"({r['replied_share']:.0%}); {r['requests']} requests, {r['reply_requests']} "
            f"carry a reply ({r['wall_s']} s)"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
