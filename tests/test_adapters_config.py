"""OpenAIEngine's four setting groups: a field given by name lands in its group, as if given in
the group; a name no group has, a field given both ways, or a group of the wrong type is a
TypeError naming it. The groups are each field's only home: the engine stores no copy, refuses
one, and a replaced group is what it sends (no server is started: the engines here are given by
URL, the last one reaches an in-process stub)."""

from __future__ import annotations

import dataclasses

import pytest
from adapter_support import SYSTEM, req, user
from stub_openai import serve, url_of

from pytest_prefixcache import EngineError
from pytest_prefixcache.adapters.http.config import (
    FIELDS,
    Baseline,
    CacheControl,
    Process,
    Readout,
)
from pytest_prefixcache.adapters.http.openai import OpenAIEngine

URL = "http://127.0.0.1:9"


def test_fields_by_name_and_in_groups_build_the_same_engine() -> None:
    flat = OpenAIEngine(
        url=URL,
        cold="salt",
        namespace_field="cache_salt",
        reset_paths="POST /a, POST /b",
        top_logprobs=20,
        check_labels=False,
        timeout=7.0,
        reuse_reference="block",
        block_size=32,
    )
    grouped = OpenAIEngine(
        url=URL,
        baseline=Baseline(cold="salt"),
        cache=CacheControl(
            namespace_field="cache_salt",
            reset_paths="POST /a, POST /b",
            reuse_reference="block",
            block_size=32,
        ),
        readout=Readout(top_logprobs=20, check_labels=False),
        process=Process(timeout=7.0),
    )
    for engine in (flat, grouped):
        assert engine.baseline.cold == "salt" and engine.supports_namespaces
        assert engine.cache.namespace_field == "cache_salt"
        assert [str(r) for r in engine.resets] == [str(r) for r in flat.resets]
        assert len(engine.resets) == 2
        read = engine.readout
        assert (read.top_logprobs, read.check_labels, engine.process.timeout) == (20, False, 7.0)
        assert (engine.reuse_reference, engine.block_size) == ("block", 32)
    assert flat.baseline == grouped.baseline and flat.cache == grouped.cache
    assert flat.readout == grouped.readout and flat.process == grouped.process


def test_defaults_are_the_groups_defaults() -> None:
    engine = OpenAIEngine(url=URL, cold="salt", namespace_header="x-ns")
    assert engine.readout == Readout()
    assert engine.process == Process()
    assert engine.readout.top_logprobs == 10 and engine.readout.check_labels
    assert [f"{r.method} {r.path}" for r in engine.resets] == ["POST /v1/cache/reset"]


def test_an_unknown_name_is_refused_with_the_nearest_one() -> None:
    with pytest.raises(TypeError, match=r"'namespace_feild' \(did you mean 'namespace_field'\?\)"):
        OpenAIEngine(url=URL, cold="salt", namespace_feild="s")


def test_a_field_given_twice_is_refused() -> None:
    with pytest.raises(TypeError, match="cold both by name and in baseline="):
        OpenAIEngine(url=URL, cold="salt", baseline=Baseline(cold="server", cold_url=URL))


def test_a_group_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(TypeError, match=r"readout=\.\.\.\) takes a Readout"):
        OpenAIEngine(url=URL, cold="salt", namespace_field="s", readout=Baseline())  # type: ignore[arg-type]


def stored_twice(engine: OpenAIEngine) -> set[str]:
    """The group fields the engine holds a copy of besides its group."""
    return FIELDS.keys() & vars(engine).keys()


def test_no_group_field_is_stored_on_the_engine() -> None:
    engines = [
        OpenAIEngine(url=URL, cold="salt", namespace_field="s", top_logprobs=5, timeout=3.0),
        OpenAIEngine(url=URL, cold_url=URL, cold="server", readout=Readout(check_labels=False)),
    ]
    for engine in engines:
        assert stored_twice(engine) == set()
    # negative control: a copy written past the refusal below is found
    engines[0].__dict__["top_logprobs"] = 5
    assert stored_twice(engines[0]) == {"top_logprobs"}


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_a_group_field_set_on_the_engine_is_refused_with_its_group(name: str) -> None:
    engine = OpenAIEngine(url=URL, cold="salt", namespace_field="s")
    group = FIELDS[name]
    fix = rf"engine\.{group} = dataclasses\.replace\(engine\.{group}, {name}=\.\.\.\)"
    with pytest.raises(AttributeError, match=fix):
        setattr(engine, name, None)
    assert stored_twice(engine) == set()
    engine.sampled_tokens = True  # negative control: the engine's own attributes stay settable
    assert engine.sampled_tokens


def test_a_replaced_group_is_what_the_engine_uses() -> None:
    """Each step's own entry names its second-best token (stub fault ``sampled_second``): the
    label check refuses the reply until the readout is replaced with ``check_labels=False``."""
    srv = serve("vllm", fault="sampled_second")
    try:
        engine = OpenAIEngine(
            url=url_of(srv),
            cold="salt",
            namespace_field="cache_salt",
            extra_body={"return_tokens_as_token_ids": True},
        )
        request = req(SYSTEM, user("hello there"))
        with pytest.raises(EngineError, match="is not the best of this step's top_logprobs"):
            engine.run(request, use_cache=True)
        engine.readout = dataclasses.replace(engine.readout, check_labels=False)
        assert engine.run(request, use_cache=True).tokens
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_vocabulary_directory_is_read_once_when_its_group_is_made() -> None:
    from pathlib import Path

    from pytest_prefixcache.adapters.http.replies import Vocabulary

    model = Path(__file__).parent.parent / "fixtures" / "tiny-llama"
    read = Readout(vocab=model)
    assert isinstance(read.vocab, Vocabulary)
    again = dataclasses.replace(read, top_logprobs=5)  # a replaced group keeps the one read
    assert again.vocab is read.vocab
    engine = OpenAIEngine(url=URL, cold_url=URL, cold="server", vocab=str(model))
    assert isinstance(engine.readout.vocab, Vocabulary)
    with pytest.raises(Exception, match=r"tokenizer\.json|No such file"):
        Readout(vocab=model / "missing")  # a wrong directory is refused when the group is made
