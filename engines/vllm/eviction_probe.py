"""Does a small KV budget make vLLM evict cached blocks? One server, a handful of requests.

Starts ``adapters.vllm.vllm_server`` on tiny-llama-hf with ``--num-gpu-blocks-override N``
(vLLM keeps one of the N as its null block) and ``--max-model-len`` (N - 1) x 32, plus vLLM's
KV residency metrics on every block (``--kv-cache-metrics --kv-cache-metrics-sample 1``), and
sends: A, A again (a full hit), then fillers B, C, ... that share nothing with A, then A again.
With room for A and the fillers (N large) the last A is a full hit; with N small it reuses
less, because the fillers' blocks evicted A's (least recently used first). Every A's reply
must still equal the first A's, to the logprob. ``--wave K`` then sends K fillers at once
(more blocks than the cache holds: vLLM queues or preempts) and compares each reply with the
same request served alone on a fresh ``cache_salt``. Prints one line per request, then the
prefix-cache and eviction metrics: ``vllm:kv_block_idle_before_evict_seconds_count`` counts
sampled blocks handed out again after they had been used (vLLM's "eviction" events).

``--verify``: instead, the verifier runs [A, A] as the suite does (each request cached, then
on a fresh ``cache_salt`` on the same server) and prints its verdict and findings: with N - 1
blocks that A fills, A's salted cold run evicts A's whole prefix before the repeat.

Usage (vLLM's interpreter and the models as engines/vllm/run.sh makes them):
  VLLM_PYTHON=".engines/vllm/venv/bin/python" VLLM_MODELS=.engines/vllm/models \
    python engines/vllm/eviction_probe.py --blocks 16 --fillers 3 --wave 4
"""

from __future__ import annotations

import argparse
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from pytest_prefixcache import Message, Outcome, Request, VerificationFailure, Verifier
from pytest_prefixcache.adapters.vllm import default_python, model_path, vllm_server

METRICS = re.compile(
    r"^(vllm:(prefix_cache_(queries|hits)_total|kv_block_idle_before_evict_seconds_count"
    r"|num_preemptions_total))\{[^}]*\} (\S+)",
    re.M,
)
BLOCKS = re.compile(r'^vllm:cache_config_info\{.*?num_gpu_blocks="(\d+)"', re.M)


def prompt(topic: str, words: int) -> Request:
    """A one-turn request about ``topic`` whose first token already differs between topics."""
    body = " ".join(f"{topic} {i}" for i in range(words))
    return Request((Message("user", (f"{topic}: {body}",)),), max_new_tokens=8)


def same(a: Outcome, b: Outcome) -> bool:
    return a.tokens == b.tokens and list(a.step_top_logprobs) == list(b.step_top_logprobs)


def verify(engine: object, first: Request) -> None:
    verifier = Verifier(engine)  # type: ignore[arg-type]
    try:
        steps = verifier.run([first, first])
    except VerificationFailure as exc:
        print("FAIL:", str(exc).splitlines()[0])
        return
    for i, step in enumerate(steps):
        allowed = None if step.match is None else step.match.allowed
        print(f"request {i}: prompt_tokens={step.cached.prompt_tokens} "
              f"cached_tokens={step.cached.cached_tokens} block reference {allowed}")  # fmt: skip
    print("PASS; findings:", verifier.report.findings or "none")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=16, help="--num-gpu-blocks-override")
    ap.add_argument("--fillers", type=int, default=3)
    ap.add_argument("--words", type=int, default=40, help="words per prompt")
    ap.add_argument("--wave", type=int, default=0, help="fillers sent at once at the end")
    ap.add_argument("--verify", action="store_true", help="the verifier on [A, A] instead")
    a = ap.parse_args()
    flags = [
        f"--num-gpu-blocks-override {a.blocks}",
        f"--max-model-len {(a.blocks - 1) * 32}",
        "--kv-cache-metrics --kv-cache-metrics-sample 1.0",
    ]
    first = prompt("apples", a.words)
    fillers = [prompt(t, a.words) for t in ("bears", "clouds", "dunes", "eels", "forts")]
    plan = [("A", first), ("A", first), *zip("BCDEF", fillers[: a.fillers]), ("A", first)]
    engine = vllm_server(model_path("text"), python=default_python(), flags=flags, audit=False)
    if a.verify:
        with engine:
            verify(engine, first)
        return
    with engine:
        ref: Outcome | None = None
        for name, req in plan:
            out = engine.run(req, use_cache=True)
            ref = ref or out
            print(
                f"{name}: prompt_tokens={out.prompt_tokens} cached_tokens={out.cached_tokens} "
                f"equals the first A: {same(out, ref) if name == 'A' else '-'}"
            )
        cold = engine.run(first, use_cache=False)
        print(f"A cold (fresh cache_salt): cached_tokens={cold.cached_tokens} "
              f"equals the first A: {same(cold, ref) if ref else '-'}")  # fmt: skip
        # half of the wave continues A (its blocks shared while in flight), half shares nothing
        text = first.messages[0].content[0]
        wave = [
            Request((Message("user", (f"{text} {t}",)),), max_new_tokens=8)
            if i % 2 == 0
            else prompt(f"w{i} {t}", a.words)
            for i, t in enumerate(("gulls", "hills", "inns", "jays") * 2)
        ]
        with ThreadPoolExecutor(a.wave or 1) as pool:
            together = list(pool.map(lambda r: engine.run(r, use_cache=True), wave[: a.wave]))
        for i, (req, out) in enumerate(zip(wave, together)):
            alone = engine.run(req, use_cache=False)
            print(f"wave {i}: prompt_tokens={out.prompt_tokens} cached_tokens={out.cached_tokens} "
                  f"equals the same request alone, cold: {same(out, alone)}")  # fmt: skip
        url = getattr(engine.server, "url", engine.server)
        with urllib.request.urlopen(f"{url}/metrics", timeout=60) as r:
            text = r.read().decode()
        for m in METRICS.finditer(text):
            print(m.group(1), m.group(4))
        print("vllm:cache_config_info num_gpu_blocks", *BLOCKS.findall(text))


if __name__ == "__main__":
    main()
