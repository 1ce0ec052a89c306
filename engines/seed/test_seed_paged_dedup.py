"""vllm-mlx 0.6.0's paged store (``--continuous-batching --use-paged-cache``) keys a stored
block by its own tokens, not by the tokens before it: the saved counterexample (a prompt whose
render repeats one block at two block-aligned positions, sent twice) must answer as it does
cold. Its control, the same shape with no repeated block, must pass on the same servers.

Skipped unless engines/seed/run.sh runs it with the paged store (SEED_ENGINE=vllm-mlx, SEED_FLAGS
with --use-paged-cache), like the targeted checks of test_seed_engines.py; the finding is a strict
xfail the same way (engines/seed/NOTES.md, "The paged store's content-only block hash").
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from test_seed_engines import ENGINE, FLAGS, VM, known_findings

from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.seed import seed_server
from pytest_prefixcache.output.streams import load_stream
from pytest_prefixcache.types import Request
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions

pytestmark = pytest.mark.skipif(
    ENGINE != "vllm-mlx" or "--use-paged-cache" not in FLAGS,
    reason="opt-in: engines/seed/run.sh with vllm-mlx and --use-paged-cache",
)

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus" / "third_party"
SAVED = CORPUS / "vllm-mlx-cb-text-paged-whole-full-equivalence" / "stream.json"

CONTENT_ONLY_BLOCK_HASH = (
    f"{VM} --continuous-batching --use-paged-cache: a 254-token prompt whose render repeats one "
    "64-token block at two block-aligned positions, sent twice: the repeat reuses 192 tokens and "
    "differs from its cold run by 0.196. BlockAwarePrefixCache.store_cache deduplicates a full "
    "block by find_cached_block(block_tokens) (a hash of that block's tokens alone, "
    "paged_cache.py compute_block_hash), and fetch_cache's find_shared_prefix looks blocks up the "
    "same way: the third block is served the second one's KV, computed at other positions"
)
KNOWN = {
    ("vllm-mlx", mode, "test_paged_stream[repeated-block]"): CONTENT_ONLY_BLOCK_HASH
    for mode in ("cb,text,paged,whole,full", "cb,text,paged,chunked,full")
}
_known_findings = known_findings(KNOWN)


def _control() -> tuple[Request, ...]:
    """The saved stream with its text replaced by 60 random 4-letter words: the same shape,
    no repeated block."""
    stream, _ = load_stream(SAVED)
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    text = " ".join("".join(rng.choice(letters) for _ in range(4)) for _ in range(60))
    return tuple(replace(r, messages=(replace(r.messages[0], content=(text,)),)) for r in stream)


@pytest.fixture
def engine() -> Iterator[OpenAIEngine]:
    with seed_server(ENGINE, FLAGS, audit=False) as e:
        yield e


@pytest.mark.parametrize("case", ["repeated-block", "control"])
def test_paged_stream(engine: OpenAIEngine, case: str, tmp_path: Path) -> None:
    """The stream's repeat equals its cold run (the plugin's equivalence check)."""
    stream = load_stream(SAVED)[0] if case == "repeated-block" else _control()
    Verifier(engine, options=VerifyOptions(failures_dir=tmp_path)).run(stream)
