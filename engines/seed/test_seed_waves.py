"""The replays of a seed engine's saved waves (vllm-mlx, rapid-mlx): each wave the concurrent
runs shrunk (issue #26 item 6), sent in flight together against the same requests served
alone, cold (the plugin's waves property).

Skipped unless engines/seed/run.sh runs it, like the targeted checks of test_seed_engines.py:
the same variables name the engine, its flags and the combination's labels (a wave replays
under the labels it was found with, its stream file's ``mode``), and a known finding is a
strict xfail the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_seed_engines import ENGINE, FLAGS, MODE, RM, VM, known_findings

from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.seed import seed_server
from pytest_prefixcache.output.streams import load_stream, waves_from
from pytest_prefixcache.session.matrix_file import read_matrix
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions

pytestmark = pytest.mark.skipif(not ENGINE, reason="opt-in: run engines/seed/run.sh")

#: The vllm-mlx 0.6.0 --mllm saved waves (vllm-mlx-waves-cb-mllm-memory-whole-b-equivalence,
#: -seqs2-equivalence: requests with the same text and other images, "answering with each
#: other's images") were the tap's ledger, not the engine: their prompts have the same ids, and
#: the ledger gave a reply another request's track (the API's own texts were each request's
#: own: benchmarks/results/seed_claims/exchange_text.txt). Fixed in tap/tracks.py; they replay
#: and must pass.

#: Found by the --mllm waves with chunked prefill and with --prefill-batch-size 1 once the tap
#: told prompts with the same ids apart: the sequential swapped-order finding within one wave.
SWAPPED_IN_A_WAVE = (
    f"{VM} --continuous-batching --mllm, waves of up to 4: two requests with the same text and "
    "the same two images in the orders [A, B] and [B, A], in flight together: one answers as the "
    "other (|diff| 0.427 at step 0 against its own cold reply, 0 tokens reused; the API's own "
    "texts are the same for both, in 6 of 6 tries): the MLLM batch generator's pixel cache keys a "
    "request's images by their sorted hashes (test_image_streams[swapped-order]), here with no "
    "earlier request"
)

#: The rapid-mlx --mllm waves' 503s and their wrong answer with nothing reused: the positions
#: rapid-mlx keeps across requests (test_seed_engines.py's MROPE_STALE and POSITIONS_KEPT).
ORDER_IN_A_WAVE = (
    f"{RM} --mllm, waves of up to 4: the positions kept across requests (test_text_after_image), "
    "differing between two servers: after a text request, "
    "an image request with a longer prompt sent 500 ms after a text request: the cached server "
    "serves the text request first (right), the cold one each request alone in stream order, "
    "the image request first, so its text request answers from the image request's positions "
    "(wrong): cached and cold differ with 0 tokens reused"
)
STALE_IN_A_WAVE = (
    f"{RM} --mllm, waves of up to 4: after a text request (89 tokens), the same longer text "
    "request (110) twice in flight together: both answer 503 'Request cancelled by model "
    "replacement' ([broadcast_shapes] (1,4,110,16) and (1,1,89,16) in mlx-vlm's mRoPE): "
    "the stale-mRoPE crash of test_text_stream, not the batch: alone it fails the same way"
)

#: Found by the rapid-mlx --mllm waves (seed 1) with every row attributed by id; classified with
#: no server in test_seed_padded_decode.py (mlx-vlm 0.7.2, which rapid-mlx pins; exact on 0.7.10).
PADDED_DECODE_IN_A_WAVE = (
    f"{RM} --mllm, waves of up to 4: two requests with the same image, 32 and 75 prompt tokens, "
    "nothing reused, in flight together: the shorter one's decode step 1 differs from its cold "
    "run by 0.652 (its first token agrees): a batched decode step attends the shorter row's left "
    "padding (mlx-vlm 0.7.2 Qwen2Model passes the cache list to create_attention_mask: no mask "
    "for one position); served one after the other (timing) the wave passes"
)

#: The saved waves' findings, as test_seed_engines.KNOWN: (engine, labels, test id) -> reason.
KNOWN = {
    **{
        (
            "vllm-mlx",
            mode,
            f"test_saved_waves[vllm-mlx-waves-{mode.replace(',', '-')}-equivalence]",
        ): (f"{SWAPPED_IN_A_WAVE} ({flags})")
        for mode, flags in [
            ("cb,mllm,memory,chunked,b", "--chunked-prefill-tokens 32"),
            ("cb,mllm,memory,whole,pb1", "--prefill-batch-size 1 --completion-batch-size 2"),
        ]
    },
    (
        "rapid-mlx",
        "mllm,memory,b,w1024",
        "test_saved_waves[rapid-mlx-waves-mllm-memory-b-w1024-fault]",
    ): STALE_IN_A_WAVE,
    (
        "rapid-mlx",
        "mllm,memory,b,w1024",
        "test_saved_waves[rapid-mlx-waves-mllm-memory-b-w1024-equivalence]",
    ): ORDER_IN_A_WAVE,
    (
        "rapid-mlx",
        "mllm,memory,b,w1024",
        "test_saved_waves[rapid-mlx-waves-mllm-memory-b-w1024-decode-equivalence]",
    ): PADDED_DECODE_IN_A_WAVE,
}
_known_findings = known_findings(KNOWN)


#: The shrunk waves of the concurrent runs (issue #26 item 6), for this engine and combination
#: (a -waves config's labels): each replayed against the engine sent waves of up to 4.
CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus" / "third_party"
REPLAYS = 3
SAVED_WAVES = sorted(
    path
    for path in CORPUS.glob(f"{ENGINE}-waves-*/stream.json")
    if ENGINE and load_stream(path)[1].get("mode") == MODE
)


#: The arguments of the engine's -waves config in matrix.toml (concurrency, claims): a saved
#: wave replays as it was found (rapid-mlx's with claims off, else the API's per-step logprobs
#: fail before the wave does).
WAVES_ARGS = next(
    (
        t.args
        for t in read_matrix(Path(__file__).with_name("matrix.toml"))
        if t.name.startswith(f"{ENGINE}-waves[")
    ),
    {},
)


@pytest.fixture  # fresh servers per saved wave: a reset leaves rapid-mlx's kept M-RoPE positions
def waves_engine() -> Iterator[OpenAIEngine]:
    concurrency = int(WAVES_ARGS.get("concurrency", 4))
    claims = bool(WAVES_ARGS.get("claims", True))
    with seed_server(ENGINE, FLAGS, concurrency=concurrency, audit=False, claims=claims) as e:
        yield e


@pytest.mark.parametrize("path", SAVED_WAVES, ids=[p.parent.name for p in SAVED_WAVES])
def test_saved_waves(waves_engine: OpenAIEngine, path: Path, tmp_path: Path) -> None:
    """A saved wave, replayed in flight together three times: every cached reply equals the
    same request served alone, cold (the plugin's waves property, its reset first). Three:
    which request a batch serves first is up to the server's timing."""
    stream, meta = load_stream(path)
    waves = waves_from(stream, meta)
    assert waves is not None, f"{path} holds no waves"
    verifier = Verifier(waves_engine, options=VerifyOptions(failures_dir=tmp_path))
    for _ in range(REPLAYS):
        verifier.run_waves(waves)
