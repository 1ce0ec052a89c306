"""A malformed or hand-edited corpus/replay JSON names the file and the field that is wrong."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_prefixcache.errors import PrefixCacheError
from pytest_prefixcache.output.streams import FORMAT, load_stream

pytest_plugins = ["pytester"]


def _stream(**request: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"messages": [{"role": "user", "content": ["hi"]}]}
    base.update(request)
    return {"format": FORMAT, "requests": [base]}


def _msg(**message: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"role": "user", "content": ["hi"]}
    base.update(message)
    return _stream(messages=[base])


CASES: list[tuple[str, Any, str]] = [
    ("no-requests-key", {"format": FORMAT}, "requests: is missing"),
    ("requests-not-a-list", {"format": FORMAT, "requests": {}}, "requests: is {}, expected a "
     "JSON array"),
    ("request-not-an-object", {"format": FORMAT, "requests": ["hi"]}, "requests[0]: is 'hi', "
     "expected a JSON object"),
    ("no-messages", {"format": FORMAT, "requests": [{}]}, "requests[0].messages: is missing"),
    ("no-role", _stream(messages=[{"content": ["x"]}]), "requests[0].messages[0].role: is "
     "missing"),
    ("bad-role", _msg(role="bot"), "requests[0].messages[0].role: Message role 'bot' is not one "
     "of system, user, assistant"),
    ("content-a-string", _msg(content="hello"), "requests[0].messages[0].content: is 'hello', "
     "expected a JSON array"),
    ("content-part-a-number", _msg(content=["a", 3]), "requests[0].messages[0].content[1]: is 3, "
     "expected a JSON object"),
    ("part-without-image", _msg(content=[{"img": "x"}]), "requests[0].messages[0].content[0]."
     "image: is missing"),
    ("unknown-image-name", _msg(content=[{"image": "nope.png"}]), "requests[0].messages[0]."
     "content[0].image: *nope.png*"),
    ("bad-image-spec", _msg(content=[{"image": {"pattern": "solid", "width": 8}}]),
     "requests[0].messages[0].content[0].image: image spec * is missing 'height'"),
    ("namespace-not-a-string", _stream(namespace=7), "requests[0].namespace: is 7, expected a "
     "string"),
    ("max-new-tokens-a-string", _stream(max_new_tokens="2"), "requests[0].max_new_tokens: is "
     "'2', expected an integer"),
    ("max-new-tokens-negative", _stream(max_new_tokens=-1), "requests[0]: Request."
     "max_new_tokens must be an int >= 0, got -1"),
    ("max-new-tokens-a-bool", _stream(max_new_tokens=True), "requests[0].max_new_tokens: is "
     "True, expected an integer"),
    ("images-not-an-object", {**_stream(), "images": []}, "images: is [], expected *"),
    ("no-requests", {"format": FORMAT, "requests": []}, "has no requests"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_stream_names_the_file_and_the_field(
    tmp_path: Path, data: Any, says: str
) -> None:
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(PrefixCacheError) as info:
        load_stream(path)
    message = str(info.value)
    assert str(path) in message
    pattern = re.escape(says).replace(r"\*", ".*")
    assert re.search(pattern, message), message


def test_not_json_and_not_utf8_name_the_file(tmp_path: Path) -> None:
    for name, raw in (("trunc.json", b'{"format": "pytest-prefixcache/stream/v1", "requ'),
                      ("latin1.json", b'{"x": "\xe9"}')):  # fmt: skip
        path = tmp_path / name
        path.write_bytes(raw)
        with pytest.raises(PrefixCacheError, match=rf"stream file .*{name}.* is not valid JSON"):
            load_stream(path)


def test_a_missing_image_file_names_the_json_file_field_and_image(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_msg(content=["x", {"image": "gone.png"}])), encoding="utf-8")
    with pytest.raises(PrefixCacheError) as info:
        load_stream(path)
    text = str(info.value)
    assert "s.json" in text and "requests[0].messages[0].content[1].image" in text
    assert "gone.png" in text


def test_a_hand_edited_replay_fails_the_session_with_the_field(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        engine="""
        import numpy as np
        from pytest_prefixcache import Outcome

        class E:
            def reset(self): pass
            def run(self, request, *, use_cache):
                return Outcome(logits=np.zeros(4, dtype=np.float32))

        build = E
        """
    )
    pytester.makefile(".json", edited=json.dumps(_msg(role="robot")))
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-engine=engine:build",
        "--prefixcache-replay=edited.json",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # not a verification failure
    result.stderr.fnmatch_lines(
        [
            "ERROR: --prefixcache-replay=edited.json: stream file *edited.json*: "
            "requests[[]0[]].messages[[]0[]].role: "
            "Message role 'robot' is not one of system, user, assistant"
        ]
    )


def test_a_malformed_corpus_scenario_is_a_usage_error(pytester: pytest.Pytester) -> None:
    corpus = pytester.mkdir("fixtures") / "corpus"
    corpus.mkdir()
    (corpus / "broken.json").write_text(json.dumps(_msg(role="robot")), encoding="utf-8")
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", "-k", "corpus",
        "--prefixcache-examples=1",
    )  # fmt: skip
    assert result.ret in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.USAGE_ERROR)
    result.stdout.fnmatch_lines(
        ["*corpus scenario: stream file *broken.json*: requests[[]0[]].messages[[]0[]].role: *"]
    )
