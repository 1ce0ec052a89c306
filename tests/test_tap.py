"""The logit tap: records from mlx_lm.server equal an offline prefill exactly; record parsing
and call attribution; the wrapper never raises into the server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pytest_prefixcache.adapters.http.chat import FIXTURES
from pytest_prefixcache.tap import (
    TapReader,
    TapRecord,
    decode_steps,
    find_prompt_call,
    prefill_start,
)

LLAMA = FIXTURES / "tiny-llama"
MESSAGES = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Hello there, tell me about cats and dogs."},
]


def rec(seq: int, n: int, offset: int) -> TapRecord:
    return TapRecord(seq, "M", n, 1, offset, np.zeros(4, dtype=np.float32))


def test_attribution_skips_stale_records() -> None:
    # a stale decode call of the previous request, then a 2-chunk prefill and 2 decode steps
    records = [rec(0, 1, 21), rec(1, 16, 16), rec(2, 1, 17), rec(3, 1, 18), rec(4, 1, 19)]
    i = find_prompt_call(records, 17)
    assert i == 2 and prefill_start(records, i) == 0
    assert [r.offset for r in decode_steps(records, i, 3)] == [17, 18, 19]
    assert find_prompt_call(records, 99) is None


def test_reader_waits_for_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "tap.jsonl"
    reader = TapReader(path)
    assert reader.read_new() == []
    line = json.dumps({"seq": 0, "cls": "M", "n": 3, "batch": 1, "offset": 3, "lp": "AACAPw=="})
    path.write_text(line + "\n" + line[:10])
    [r] = reader.read_new()
    assert (r.n_inputs, r.offset, r.start, r.logprobs.tolist()) == (3, 3, 0, [1.0])
    with path.open("a") as f:
        f.write(line[10:] + "\n")
    assert [r.seq for r in reader.read_new()] == [0]


def test_the_wrapper_never_raises(tmp_path: Path) -> None:
    from pytest_prefixcache.tap import wrap

    class Odd:
        def __call__(self, inputs: object, cache: object = None) -> str:
            return "not an array"

    wrap._wrap(Odd, wrap._Sink(str(tmp_path / "t.jsonl")))
    assert Odd()(object()) == "not an array"


def test_launcher_usage_errors() -> None:
    run = [sys.executable, "-m", "pytest_prefixcache.tap"]
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    assert subprocess.run(run, env=env, capture_output=True, timeout=60).returncode == 2
    done = subprocess.run([*run, "json:dumps"], env=env, capture_output=True, timeout=60)
    assert done.returncode == 2 and b"PREFIXCACHE_TAP" in done.stderr


@pytest.fixture(scope="module")
def tapped_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, TapReader]]:
    pytest.importorskip("mlx_lm")
    from pytest_prefixcache.adapters.http.server import ServerProcess

    path = tmp_path_factory.mktemp("tap") / "records.jsonl"
    cmd = (
        "{python} -m pytest_prefixcache.tap mlx_lm.server:main "
        f"--model {LLAMA} --host 127.0.0.1 --port {{port}}"
    )
    server = ServerProcess(cmd, env={"PREFIXCACHE_TAP": str(path)}, start_timeout=120).start()
    try:
        yield server.url, TapReader(path)
    finally:
        server.stop()


def chat(url: str, max_tokens: int) -> dict:
    from pytest_prefixcache.adapters.http.server import http_json

    body = {"messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0.0}
    status, reply = http_json("POST", url + "/v1/chat/completions", body, timeout=60)
    assert status == 200, reply
    return reply


def settled(reader: TapReader, prompt: int, count: int) -> tuple[list[TapRecord], int]:
    records: list[TapRecord] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        records += reader.read_new()
        i = find_prompt_call(records, prompt)
        if i is not None and len(decode_steps(records, i, count)) == count:
            return records, i
        time.sleep(0.05)
    raise AssertionError(f"no settled tap records for a {prompt}-token prompt: {records}")


def test_records_match_an_offline_prefill_exactly(tapped_server: tuple[str, TapReader]) -> None:
    import mlx.core as mx
    from mlx_lm import load

    url, reader = tapped_server
    reply = chat(url, max_tokens=3)
    n = reply["usage"]["prompt_tokens"]
    records, i = settled(reader, n, 3)
    steps = decode_steps(records, i, 3)

    model, tokenizer = load(str(LLAMA))[:2]
    prompt = list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True))
    assert len(prompt) == n and prefill_start(records, i) == 0
    generated = [int(np.argmax(r.logprobs)) for r in steps]
    for k, record in enumerate(steps):
        logits = model(mx.array([prompt + generated[:k]]))[0, -1].astype(mx.float32)
        offline = np.array(logits - mx.logsumexp(logits))
        assert np.array_equal(record.logprobs, offline), f"step {k}"

    # a repeat: the tap sees what was really prefilled, and the API agrees
    again = chat(url, max_tokens=1)
    records, i = settled(reader, n, 1)
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert n - prefill_start(records, i) == n - cached == 1
    assert np.array_equal(records[i].logprobs, steps[0].logprobs)
