"""OpenAIEngine's four setting groups: a field given by name lands in its group, as if given in
the group; a name no group has, a field given both ways, or a group of the wrong type is a
TypeError naming it (no server is started: the engines here are given by URL)."""

from __future__ import annotations

import pytest

from pytest_prefixcache.adapters.http.config import Baseline, CacheControl, Process, Readout
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
        assert engine.cold == "salt" and engine.supports_namespaces
        assert engine.namespace_field == "cache_salt"
        assert [str(r) for r in engine.resets] == [str(r) for r in flat.resets]
        assert len(engine.resets) == 2
        assert (engine.top_logprobs, engine.check_labels, engine.timeout) == (20, False, 7.0)
        assert (engine.reuse_reference, engine.block_size) == ("block", 32)
    assert flat.baseline == grouped.baseline and flat.cache == grouped.cache
    assert flat.readout == grouped.readout and flat.process == grouped.process


def test_defaults_are_the_groups_defaults() -> None:
    engine = OpenAIEngine(url=URL, cold="salt", namespace_header="x-ns")
    assert engine.readout == Readout()
    assert engine.process == Process()
    assert engine.top_logprobs == 10 and engine.check_labels and not engine.tap
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
