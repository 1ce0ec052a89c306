"""The reference server through the official ``openai`` client (in-process on 127.0.0.1:0;
the command-line tests start ``python -m reference_engine.server`` and stop it by PID)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from reference_engine.engine import Engine, default_model_path  # noqa: E402
from reference_engine.server import main, make_server  # noqa: E402

MODEL = "tiny-qwen2-vl"
HELLO = [{"role": "user", "content": "hello there"}]
PROMPT = "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"  # HELLO, rendered
EXT = {"prefixcache": {}}  # the reply then carries the prompt's token ids


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    engine = Engine.from_pretrained(default_model_path())
    srv = make_server(engine, "127.0.0.1", 0, model_name=MODEL)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join()


@pytest.fixture(scope="module")
def client(server: Any) -> Any:
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="x", max_retries=0
    )


def chat(client: Any, messages: list[dict[str, Any]] = HELLO, **kw: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)


def prompt_ids(client: Any, messages: list[dict[str, Any]]) -> list[int]:
    reply = chat(client, messages, max_tokens=1, extra_body=EXT)
    return list(reply.model_extra["prefixcache"]["token_ids"])


def test_chat(client: Any) -> None:
    reply = chat(client, max_tokens=6, logprobs=True, top_logprobs=3)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == MODEL
    assert len(reply.choices) == 1 and choice.finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens == len(choice.logprobs.content) == 6
    assert reply.usage.prompt_tokens == len(prompt_ids(client, HELLO))
    for step in choice.logprobs.content:
        tops = [t.logprob for t in step.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert step.logprob == tops[0]  # greedy: each token is the most likely one


@pytest.mark.parametrize("include_usage", [True, False])
def test_stream_equals_the_reply(client: Any, include_usage: bool) -> None:
    kw: dict[str, Any] = {"max_tokens": 8, "logprobs": True, "top_logprobs": 2, "extra_body": EXT}
    whole = chat(client, **kw)
    options = {"include_usage": include_usage}
    chunks = list(chat(client, stream=True, stream_options=options, **kw))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == whole.choices[0].message.content
    streamed = [
        e for c in with_choices if c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert [e.model_dump() for e in streamed] == [
        e.model_dump() for e in whole.choices[0].logprobs.content
    ]
    assert with_choices[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    ext = with_choices[-1].model_extra["prefixcache"]  # on the chunk that finishes
    assert ext["token_ids"] == whole.model_extra["prefixcache"]["token_ids"]
    if include_usage:  # the last chunk alone carries it, with no choices
        assert not chunks[-1].choices
        assert all(c.usage is None for c in chunks[:-1])
        last, usage = chunks[-1].usage, whole.usage
        assert (last.prompt_tokens, last.completion_tokens) == (
            usage.prompt_tokens,
            usage.completion_tokens,
        )
        assert last.prompt_tokens_details.cached_tokens > 0  # the same prompt again
    else:  # negative control: no usage anywhere
        assert all(c.usage is None for c in chunks)


def test_stop_cuts_at_the_first_stop_string(client: Any) -> None:
    whole = chat(client, max_tokens=12).choices[0].message.content
    stop = next(whole[i : i + 2] for i in range(1, len(whole) - 1) if whole[i : i + 2].strip())
    reply = chat(client, max_tokens=12, stop=[stop, "never in the text"], logprobs=True)
    cut = whole[: whole.index(stop)]
    assert reply.choices[0].message.content == cut
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == len(reply.choices[0].logprobs.content) < 12
    streamed = chat(client, max_tokens=12, stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == cut
    # Negative control: a stop string that never comes changes nothing.
    assert chat(client, max_tokens=12, stop="never").choices[0].message.content == whole


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("n", 2),
        ("temperature", 0.7),
        ("top_p", 0.5),
        ("presence_penalty", 0.5),
        ("frequency_penalty", -1.0),
        ("logit_bias", {"42": 5}),
    ],
)
def test_sampling_is_refused_by_name(client: Any, param: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, max_tokens=2, **{param: value})
    error = info.value.body
    assert error["param"] == param and error["code"] == "unsupported_value"
    assert f"{param}={value!r}" in error["message"]


def test_greedy_values_are_accepted(client: Any) -> None:
    """Negative control of the refusals: the values that mean greedy change nothing."""
    plain = chat(client, max_tokens=6).choices[0].message.content
    greedy = chat(
        client,
        max_tokens=6,
        n=1,
        temperature=0,
        top_p=1,
        seed=7,
        presence_penalty=0,
        frequency_penalty=0,
    )
    assert len(greedy.choices) == 1 and greedy.choices[0].message.content == plain


def test_developer_is_system(client: Any) -> None:
    def conversation(role: str) -> list[dict[str, Any]]:
        return [{"role": role, "content": "be brief"}, *HELLO]

    assert prompt_ids(client, conversation("developer")) == prompt_ids(
        client, conversation("system")
    )
    assert prompt_ids(client, conversation("developer")) != prompt_ids(client, conversation("user"))
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, conversation("robot"))
    assert info.value.body["param"] == "messages[0].role"


def weather(city: str) -> list[dict[str, Any]]:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }
    return [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]


def test_a_tool_call_conversation(client: Any, server: Any) -> None:
    reply = chat(client, weather("Paris"), max_tokens=4, extra_body=EXT)
    assert reply.choices[0].message.content is not None
    text = server.engine.model.tokenizer.decode(reply.model_extra["prefixcache"]["token_ids"])
    assert text == (
        "<|im_start|>user\nweather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # Negative control: the call's arguments reach the prompt.
    assert prompt_ids(client, weather("Rome")) != prompt_ids(client, weather("Paris"))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, weather("Paris"), tools=tools)
    assert info.value.body["param"] == "tools"


def test_completions_share_the_engine_and_cache(client: Any) -> None:
    whole = chat(client, max_tokens=8)
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, logprobs=2)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == whole.choices[0].message.content
    assert reply.usage.prompt_tokens == whole.usage.prompt_tokens
    assert reply.usage.prompt_tokens_details.cached_tokens > 0  # the chat request's blocks
    assert len(reply.choices[0].logprobs.tokens) == reply.usage.completion_tokens
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reply.choices[0].text
    # Negative control: without the template's turn markers it is another prompt.
    other = client.completions.create(model=MODEL, prompt="hello there", max_tokens=8)
    assert other.usage.prompt_tokens < reply.usage.prompt_tokens


def test_errors_have_the_openai_shape(server: Any, client: Any) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.embeddings.create(model=MODEL, input="x")
    assert set(info.value.body) == {"message", "type", "param", "code"}
    for bad, param in [
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs=true
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"max_tokens": -1}, "max_tokens"),
    ]:
        with pytest.raises(openai.BadRequestError) as bad_request:
            chat(client, **{"max_tokens": 1, **bad})
        assert bad_request.value.body["param"] == param
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    req = urllib.request.Request(url, data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=30)
    assert http.value.code == 400
    assert set(json.loads(http.value.read())["error"]) == {"message", "type", "param", "code"}


def test_server_timing_is_the_engines_run(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A completion reply's Server-Timing header is the time between the two clock reads
    around the engine's run (a clock that advances 1.5 s per read: 1500 ms)."""
    import reference_engine.server as module

    ticks = iter(range(100))
    monkeypatch.setattr(module, "_clock", lambda: 1.5 * next(ticks))
    base = f"http://127.0.0.1:{server.server_address[1]}"
    body = json.dumps({"messages": HELLO, "max_tokens": 1}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=60) as reply:
        assert reply.headers["Server-Timing"] == "engine;dur=1500.000"
    assert next(ticks) == 2  # two reads: around the run
    with urllib.request.urlopen(base + "/health", timeout=30) as health:
        assert health.headers["Server-Timing"] is None  # no engine ran


@pytest.mark.parametrize(
    ("flags", "name"), [([], MODEL), (["--served-model-name", "ref-7"], "ref-7")]
)
@pytest.mark.slow
def test_models_list_names_the_model(flags: list[str], name: str) -> None:
    """The id is the model directory's name (the fixture's, wherever it was built) or
    --served-model-name, never a path."""
    cmd = [sys.executable, "-m", "reference_engine.server", "--host", "127.0.0.1", "--port", "0"]
    cmd += flags
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        client = openai.OpenAI(base_url=line.split()[-1] + "/v1", api_key="x", max_retries=0)
        assert default_model_path().name == MODEL
        assert [m.id for m in client.models.list()] == [name]
        assert client.models.retrieve(name).id == name
        reply = client.chat.completions.create(model=name, messages=HELLO, max_tokens=1)
        assert reply.model == name
        with pytest.raises(openai.NotFoundError):  # negative control
            client.models.retrieve("other-model")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def test_help_shows_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    options = text.split("options:")[1].split("\n  -")[1:]
    assert len(options) == 13  # -h and the twelve options (the disk tier, KV bits, adapters)
    for option in options:
        if not option.startswith("h, --help"):
            assert "(default: " in " ".join(option.split()), option
