"""Reading chat completion replies without a server: ids, sorting, usage, extensions, env."""

from __future__ import annotations

import base64
import json
import sys

import numpy as np
import pytest

from pytest_prefixcache import EngineError, Outcome
from pytest_prefixcache.adapters.http.chat import FIXTURES, data_url, log_softmax, openai_messages
from pytest_prefixcache.adapters.http.replies import Vocabulary, parse_reply, with_extension


def reply(steps: list[list[dict]], usage: dict | None = None, **extra: object) -> dict:
    content = [{"id": -1, "token": "?", "logprob": 0.0, "top_logprobs": s} for s in steps]
    return {"choices": [{"logprobs": {"content": content}}], "usage": usage or {}, **extra}


def test_steps_are_sorted_here_not_trusted_from_the_label() -> None:
    # mlx-lm 0.32.2 style: unsorted top-k, the step labelled with its first element
    r = reply(
        [[{"id": 7, "logprob": -3.0}, {"id": 4, "logprob": -1.0}, {"id": 9, "logprob": -2.0}]],
        {
            "prompt_tokens": 12,
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 8},
        },
    )
    parsed = parse_reply(r)
    assert parsed.tokens == (4,) and parsed.steps[0] == {7: -3.0, 4: -1.0, 9: -2.0}
    assert (parsed.cached_tokens, parsed.prompt_tokens, parsed.completion_tokens) == (8, 12, 1)


def test_missing_usage_details_mean_unknown_not_zero() -> None:
    parsed = parse_reply(reply([[{"id": 1, "logprob": -1.0}]], {"prompt_tokens": 5}))
    assert parsed.cached_tokens is None and parsed.prompt_tokens == 5


def test_entries_without_ids_go_through_the_vocabulary() -> None:
    vocab = Vocabulary(FIXTURES / "tiny-llama")
    named = {t: i for t, i in vocab.names.items() if len(t) > 2}
    (text, tid), (text2, tid2) = list(named.items())[:2]
    steps = [[{"token": text, "logprob": -0.5}, {"token": text2, "logprob": -1.5}]]
    assert parse_reply(reply(steps), vocab).tokens == (tid,)
    # the best entry cannot be named: no greedy token is claimed for that step
    steps = [[{"token": "\ufffd", "logprob": -0.1}, {"token": text2, "logprob": -1.5}]]
    parsed = parse_reply(reply(steps), vocab)
    assert parsed.tokens == () and parsed.steps == [{tid2: -1.5}]
    raw = Vocabulary(FIXTURES / "tiny-llama", kind="raw")
    assert all(raw({"token": t}) == i for t, i in list(raw.names.items())[:50])


def test_the_vocabulary_writes_token_ids_as_a_reply_text() -> None:
    # what the tap's ledger compares a reply's text with (prompts with the same ids)
    from tokenizers import Tokenizer

    vocab = Vocabulary(FIXTURES / "tiny-llama")
    tok = Tokenizer.from_file(str(FIXTURES / "tiny-llama" / "tokenizer.json"))
    ids = tok.encode("describe the image", add_special_tokens=False).ids
    assert vocab.decode(ids) == "describe the image"
    assert (
        vocab.decode([*ids, tok.token_to_id("<|im_end|>")]) == "describe the image"
    )  # no specials


def test_a_malformed_reply_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="unexpected chat completion reply"):
        parse_reply({"choices": []})


def test_the_reference_extension_fills_the_outcome() -> None:
    logits = [np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)]
    ext = {
        "token_ids": [1, 2, 3],
        "image_spans": [[1, 2, "abc"]],
        "merges": [[1, 1]],
        "step_logits": [base64.b64encode(x.tobytes()).decode() for x in logits],
    }
    out = with_extension(Outcome(tokens=(3, 0)), {"prefixcache": ext}, n=2)
    assert out.token_ids == (1, 2, 3) and out.image_spans == ((1, 2, "abc"),)
    assert out.logits is not None and (out.logits == logits[0]).all()
    assert len(out.step_logits) == 2 and out.merges == ((1, 1),)
    with pytest.raises(EngineError, match="no 'prefixcache' object"):
        with_extension(Outcome(), {}, n=1)


def test_messages_and_images_as_openai_wants_them() -> None:
    from adapter_support import SYSTEM, img, req, user

    image = img(3, 20, 10)
    msgs = openai_messages(req(SYSTEM, user("look", image)))
    assert msgs[0] == {"role": "system", "content": SYSTEM.content[0]}
    assert msgs[1]["content"][0] == {"type": "text", "text": "look"}
    url = msgs[1]["content"][1]["image_url"]["url"]
    assert url == data_url(image) and url.startswith("data:image/png;base64,")
    from pytest_prefixcache import Image

    assert Image.open(base64.b64decode(url.partition(",")[2])) == image  # lossless
    lp = log_softmax(np.array([1.0, 2.0, 3.0], dtype=np.float32))
    assert lp.dtype == np.float32 and abs(float(np.exp(lp).sum()) - 1) < 1e-6


def test_from_env_needs_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_prefixcache.adapters.presets import from_env

    monkeypatch.delenv("PREFIXCACHE_SERVER_CMD", raising=False)
    monkeypatch.delenv("PREFIXCACHE_SERVER_URL", raising=False)
    with pytest.raises(EngineError, match="PREFIXCACHE_SERVER_CMD"):
        from_env()


def test_importing_the_adapters_imports_no_engine() -> None:
    import subprocess

    code = (
        "import sys, json, pytest_prefixcache.adapters.mlx_lm, pytest_prefixcache.adapters."
        "mlx_vlm_apc, pytest_prefixcache.adapters.http.openai, "
        "pytest_prefixcache.adapters.presets, "
        "pytest_prefixcache.tap; print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('mlx', 'mlx_lm', 'mlx_vlm', 'reference_engine'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_every_form_of_token_identity() -> None:
    from pytest_prefixcache.adapters.http.replies import token_id

    vocab = Vocabulary(FIXTURES / "tiny-llama")
    text, tid = next((t, i) for t, i in vocab.names.items() if len(t) > 2)
    assert token_id({"id": 7, "token": "token_id:9"}) == 7  # an id wins
    assert token_id({"token": "token_id:42", "logprob": -1.0}) == 42  # vLLM's token ids
    assert token_id({"token": text}, vocab) == tid
    assert token_id({"bytes": list(text.encode())}, vocab) == tid  # bytes, no token text
    assert token_id({"token": "", "bytes": []}, vocab) is None  # vLLM's '' cannot be told
    assert token_id({"token": text}) is None  # no vocabulary: not guessed


def test_logprob_problems_name_the_step_and_what_came_back() -> None:
    from pytest_prefixcache.adapters.http.replies import logprob_problems

    top = [{"id": 4, "logprob": -1.0}, {"id": 9, "logprob": -2.0}]
    fine = reply([top, top], {"completion_tokens": 2})
    assert logprob_problems(parse_reply(fine), 2, labels=False) == []
    # the step's own label (-1) is not its best entry: with labels checked that is a shift
    assert "decode step 0: the server's token -1" in logprob_problems(parse_reply(fine), 2)[0]
    more = parse_reply(reply([top, top, top], {"completion_tokens": 2}))
    assert logprob_problems(more, 2, labels=False)[0].startswith(
        "3 logprobs entries for usage.completion_tokens=2"
    )
    ids = parse_reply({**fine, "choices": [{**fine["choices"][0], "token_ids": [4, 5]}]})
    (problem,) = logprob_problems(ids, 2, labels=False)
    assert problem.startswith("decode step 1: the server's token 5 (logprob absent)")
    empty = parse_reply(reply([[]], {"completion_tokens": 1}))
    assert logprob_problems(empty, 1, labels=False) == [
        "decode step 0: no top_logprobs (the entry: "
        "{'id': -1, 'token': '?', 'logprob': 0.0, 'top_logprobs': []})"
    ]


def test_llama_timings_stand_in_for_missing_usage_details() -> None:
    r = reply([[{"id": 1, "logprob": -1.0}]], {"prompt_tokens": 70}, tokens_cached=70)
    assert parse_reply({**r, "timings": {"cache_n": 64, "prompt_n": 6}}).cached_tokens == 64
    assert parse_reply(r).cached_tokens is None  # tokens_cached is the prompt, not reuse


def test_a_null_logprob_names_its_step() -> None:
    r = reply([[{"id": 1, "logprob": -1.0}], [{"id": 2, "logprob": None}]])
    with pytest.raises(EngineError, match=r"decode step 1: a top_logprobs entry has no logprob"):
        parse_reply(r)


def test_from_env_declares_the_cache_design(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_prefixcache import CacheDesign
    from pytest_prefixcache.adapters.presets import from_env

    for k, v in {"PREFIXCACHE_SERVER_URL": "http://127.0.0.1:9", "PREFIXCACHE_COLD": "salt",
                 "PREFIXCACHE_NAMESPACE_HEADER": "X-NS"}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    assert CacheDesign.of(from_env()) == CacheDesign()
    monkeypatch.setenv("PREFIXCACHE_REUSE_REFERENCE", "block")
    monkeypatch.setenv("PREFIXCACHE_BLOCK_SIZE", "32")
    assert CacheDesign.of(from_env()) == CacheDesign("block", 32)
    monkeypatch.setenv("PREFIXCACHE_BLOCK_SIZE", "x")
    with pytest.raises(EngineError, match="PREFIXCACHE_BLOCK_SIZE='x' is not an integer >= 1"):
        from_env()
    monkeypatch.delenv("PREFIXCACHE_BLOCK_SIZE")
    monkeypatch.setenv("PREFIXCACHE_REUSE_REFERENCE", "snap")
    with pytest.raises(
        EngineError, match="PREFIXCACHE_REUSE_REFERENCE='snap' is not one of token, snapshot, block"
    ):
        CacheDesign.of(from_env())
