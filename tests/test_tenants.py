"""Adapters and salts as identities (#34 item 3): the streams carry ``Request.adapter`` only to
engines that declare adapters, the reference engine applies the adapter per request and keys
by it, the ``isolation`` row and check (with the mutants that break it as negative controls),
the stream files, and the reference server's ``model``/``cache_salt`` fields."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis.errors import InvalidArgument

from pytest_prefixcache.checks.isolation import (
    ISOLATION,
    NO_CROSSING,
    isolation_problems,
    isolation_row,
)
from pytest_prefixcache.checks.oracle import ReuseOracle
from pytest_prefixcache.errors import EngineError, RequestError, VerificationFailure
from pytest_prefixcache.output.streams import load_stream, stream_to_json
from pytest_prefixcache.strategies import request_streams, stream_kwargs
from pytest_prefixcache.types import Message, Outcome, Request
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions

pytest_plugins = ["pytester"]

SYS = Message("system", ("You are a careful assistant; answer in one short sentence.",))
R = Request((SYS, Message("user", ("describe the weather over the harbor today",))), "", 2)
A = Request(R.messages, "", 2, "lora")


def test_requests_carry_an_adapter_in_their_scope() -> None:
    assert R.scope == "" and A.scope != R.scope and A.adapter == "lora"
    assert Request(R.messages, "t").scope != A.scope
    with pytest.raises(RequestError, match=r"Request\.adapter must be None or a non-empty str"):
        Request(R.messages, adapter="")


@settings(max_examples=40, database=None, deadline=None)
@given(request_streams(adapters=("a", "b"), max_images_per_message=0))
def test_streams_draw_adapters_only_from_the_given_ones(stream: tuple[Request, ...]) -> None:
    assert {r.adapter for r in stream} <= {None, "a", "b"}


def test_the_adapter_move_gives_the_same_prompt_another_identity() -> None:
    streams = request_streams(adapters=("a",), moves=("new", "adapter"), max_images_per_message=0)
    s = find(streams, lambda s: any(r.adapter != s[0].adapter for r in s[1:]))
    assert len(s) == 2 and s[1].messages == s[0].messages and s[1].adapter != s[0].adapter
    # other moves keep their base's adapter (the first request, a new one, draws it)
    kept = find(
        request_streams(adapters=("a",), moves=("append",), max_images_per_message=0),
        lambda s: s[0].adapter == "a" and len(s) >= 3,
    )
    assert [r.adapter for r in kept] == ["a"] * len(kept)


def test_engines_without_adapters_are_never_sent_one() -> None:
    with pytest.raises(InvalidArgument, match="the adapter move needs adapters"):
        request_streams(moves=("adapter",)).validate()

    class WithAdapters:
        adapters = ("x",)

    assert "adapter" not in stream_kwargs(object())["moves"]
    assert "adapters" not in stream_kwargs(object())
    kw = stream_kwargs(WithAdapters())
    assert kw["adapters"] == ("x",) and "adapter" in kw["moves"]


def test_stream_files_keep_the_adapter(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(stream_to_json((R, A), "two identities")))
    loaded, _ = load_stream(path)
    assert [r.adapter for r in loaded] == [None, "lora"]
    assert "adapter" not in json.loads(path.read_text())["requests"][0]  # old files unchanged


def _out(cached: int) -> Outcome:
    return Outcome(logits=np.zeros(4), cached_tokens=cached, prompt_tokens=10)


def test_isolation_check_and_its_control() -> None:
    oracle = ReuseOracle()
    ids = list(range(10))
    oracle.add(0, R.scope, ids, ())
    own = oracle.match(A.scope, ids, ())
    crossing = oracle.elsewhere(A.scope, ids, ())
    assert crossing == (9, "") and isolation_row(own, crossing) == "applied"
    [problem] = isolation_problems(_out(9), own, crossing, A.scope)
    assert problem.check == ISOLATION and "adapter 'lora'" in problem.headline
    assert isolation_problems(_out(0), own, crossing, A.scope) == []  # the control
    same = oracle.match(R.scope, ids, ())  # its own scope allows the reuse
    assert isolation_row(same, oracle.elsewhere(R.scope, ids, ())) == NO_CROSSING
    assert isolation_problems(_out(9), same, oracle.elsewhere(R.scope, ids, ()), R.scope) == []


def test_the_engine_applies_the_adapter_per_request_and_keys_by_it(model: Any) -> None:
    from reference_engine import Engine
    from reference_engine.mutants.tenants import AdapterNotKeyed

    engine = Engine(model, adapters="fixture")
    assert engine.adapters == ("lora",)
    cold_r, cold_a = engine.run(R, use_cache=False), engine.run(A, use_cache=False)
    assert np.abs(np.array(cold_r.logits) - np.array(cold_a.logits)).max() > 0.1
    for request, cold in ((R, cold_r), (A, cold_a), (A, cold_a), (R, cold_r)):
        warm = engine.run(request)
        np.testing.assert_array_equal(np.array(warm.logits), np.array(cold.logits))
    assert (engine.run(A).cached_tokens or 0) > 0  # its own repeat reuses
    fresh = Engine(model, adapters="fixture")
    fresh.run(R)
    assert fresh.run(A).cached_tokens == 0  # same prompt, other identity: nothing reused
    with pytest.raises(EngineError, match="request adapter 'nope' is not loaded"):
        fresh.run(Request(R.messages, adapter="nope"))
    plain = Engine(model)  # an engine without adapters runs the base weights, bit for bit
    np.testing.assert_array_equal(np.array(plain.run(R).logits), np.array(cold_r.logits))
    # negative control: keyed without the adapter, the adapter's request reuses base KV
    mutant = AdapterNotKeyed(model)
    mutant.run(R)
    bad = mutant.run(A)
    assert (bad.cached_tokens or 0) > 0
    assert np.abs(np.array(bad.logits) - np.array(cold_a.logits)).max() > 0


def test_the_verifier_counts_isolation_and_catches_the_mutants(model: Any, tmp_path: Path) -> None:
    from reference_engine import Engine
    from reference_engine.mutants import MUTANTS

    options = VerifyOptions(failures_dir=tmp_path, timeout=600.0)
    verifier = Verifier(Engine(model, adapters="fixture"), options=options)
    verifier.run((R, A, Request(R.messages, "tenant-b", 2)))
    assert verifier.report.coverage[ISOLATION] == {NO_CROSSING: 1, "applied": 2}
    with pytest.raises(VerificationFailure) as info:
        Verifier(MUTANTS["adapter_not_keyed"].build(model), options=options).run((R, A))
    assert info.value.check == ISOLATION and info.value.request_index == 1


def test_the_reference_server_takes_the_adapter_as_model_and_cache_salt(model: Any) -> None:
    from reference_engine import Engine
    from reference_engine.server import make_server

    srv = make_server(Engine(model, adapters="fixture"), "127.0.0.1", 0, model_name="base")
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/v1/chat/completions"

    def cached(**fields: Any) -> int:
        body = {"messages": [{"role": "user", "content": "tell me about the harbor"}], **fields}
        body.update(max_tokens=1, temperature=0.0)
        req = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
        req.add_header("content-type", "application/json")
        with urllib.request.urlopen(req, timeout=120) as reply:
            usage = json.loads(reply.read())["usage"]
        return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)

    try:
        assert cached(model="base") == 0
        assert cached(model="base") > 0  # the control: a repeat reuses
        assert cached(model="lora") == 0  # the adapter is another identity
        assert cached(model="base", cache_salt="t1") == 0  # so is a salt
        assert cached(model="base", cache_salt="t1") > 0
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()


class _Timed:
    """A timed engine without a clock: a miss ~30 ms, a hit ~4 ms; keyed by the whole scope,
    or (``adapter_blind``) by the namespace alone."""

    def __init__(self, *, adapter_blind: bool = False) -> None:
        self.blind, self.seen = adapter_blind, set[tuple[str, str]]()
        self.rng = np.random.default_rng(3)

    def reset(self) -> None:
        self.seen.clear()

    def __call__(self, request: Request) -> tuple[Outcome, float]:
        key = (request.namespace if self.blind else request.scope, str(request.messages[0]))
        hit = key in self.seen
        self.seen.add(key)
        seconds = (0.004 if hit else 0.030) * float(self.rng.uniform(0.8, 1.2))
        return Outcome(
            logits=np.zeros(4), cached_tokens=90 if hit else 0, prompt_tokens=99
        ), seconds


def test_the_timing_audit_runs_across_adapters_with_its_control() -> None:
    from pytest_prefixcache.verify.isolation import NAMESPACES, audit, identity_pairs

    pairs = identity_pairs(True, ("lora",))
    assert pairs == {"namespaces": NAMESPACES, "adapter 'lora'": (("A", None), ("A", "lora"))}
    assert identity_pairs(False, ()) == {}
    # an engine with adapters and no namespaces (llama-server) is sent none at all
    assert identity_pairs(False, ("lora",)) == {"adapter 'lora'": (("", None), ("", "lora"))}
    sent: list[str] = []
    blind = _Timed(adapter_blind=False)

    def no_namespaces(r: Request) -> tuple[Outcome, float]:
        sent.append(r.namespace)
        return blind(r)

    audit(no_namespaces, samples=3, across=identity_pairs(False, ("lora",))["adapter 'lora'"])
    assert set(sent) == {""}
    across = pairs["adapter 'lora'"]
    for blind, verdict in ((False, "pass"), (True, "leak")):
        engine = _Timed(adapter_blind=blind)
        result = audit(engine, reset=engine.reset, samples=20, across=across, label="adapter")
        assert result.verdict == verdict, result.lines()
        assert result.control.pvalue < 0.01  # the positive control has power either way
        assert result.lines()[0].startswith("across adapter: KS")


@pytest.mark.timing
@pytest.mark.parametrize(
    ("name", "verdict"), [("reference", "pass"), ("adapter_not_keyed", "leak")]
)
def test_the_reference_engine_passes_the_adapter_audit_and_the_mutant_leaks(
    model: Any, name: str, verdict: str
) -> None:
    from pytest_prefixcache.verify.isolation import audit, identity_pairs, timed
    from reference_engine import Engine
    from reference_engine.mutants import MUTANTS

    engine = (
        Engine(model, adapters="fixture") if name == "reference" else MUTANTS[name].build(model)
    )
    across = identity_pairs(True, engine.adapters)["adapter 'lora'"]
    result = audit(timed(engine), reset=engine.reset, seed=1, across=across, label="adapter")
    assert result.verdict == verdict, result.lines()
    assert result.control.pvalue < 0.01


def test_adapters_share_no_image_encoding_and_no_remembered_piece(model: Any) -> None:
    """The caches beside the KV blocks are per scope too: another adapter's image or text is
    not a faster hit (a timing side channel across adapters), its own repeat is."""
    from pytest_prefixcache.images import make_image
    from reference_engine import Engine

    engine = Engine(model, adapters="fixture")
    assert engine.tokens is not None
    image = make_image("noise", 64, 64, seed=5)
    r = Request((SYS, Message("user", ("A text only the base model saw.", image))), "", 0)
    engine.run(r)
    encoded, first = engine.stats.vision_encoded, engine.tokens.hits
    engine.run(Request(r.messages, adapter="lora"))
    assert engine.stats.vision_encoded == encoded + 1  # encoded again for the adapter
    assert engine.tokens.hits == 2 * first  # and tokenised again
    engine.run(Request(r.messages, adapter="lora"))  # the control: its own repeat hits both
    assert engine.stats.vision_encoded == encoded + 1 and engine.tokens.hits > 3 * first


def test_the_builder_reproduces_the_shipped_vlm_adapters(tmp_path: Path) -> None:
    from reference_engine.fixtures.adapters import adapter_dir
    from reference_engine.fixtures.vlm_adapters import VLM_ADAPTER_MODELS, build_vlm_adapter

    fixtures = Path(__file__).resolve().parent.parent / "fixtures"
    for name in VLM_ADAPTER_MODELS:
        (tmp_path / name).symlink_to(fixtures / name)
        built, shipped = build_vlm_adapter(tmp_path, name), adapter_dir(fixtures, name)
        files = sorted(p.name for p in shipped.iterdir())
        assert (
            files
            == sorted(p.name for p in built.iterdir())
            == ["adapter_config.json", "adapters.safetensors"]
        )
        for f in files:
            assert (built / f).read_bytes() == (shipped / f).read_bytes(), (name, f)
    with pytest.raises(ValueError, match="no adapter is defined for fixture 'tiny-llama'"):
        build_vlm_adapter(tmp_path, "tiny-llama")


def test_a_bad_adapter_is_named(model: Any, tmp_path: Path) -> None:
    import shutil

    import mlx.core as mx

    from reference_engine import Engine
    from reference_engine.lora import ADAPTERS_ENV, adapters_from_env

    with pytest.raises(EngineError, match=r"adapter 'x' at .* has no adapter_config\.json"):
        Engine(model, adapters={"x": tmp_path})
    good = Path(__file__).resolve().parent.parent / "fixtures" / "adapters" / "tiny-qwen2-vl-lora"
    for case, says in (("layer", "has no module 'model.layers.9"), ("shape", "does not fit")):
        bad = shutil.copytree(good, tmp_path / case)
        weights = mx.load(str(bad / "adapters.safetensors"))
        assert isinstance(weights, dict)
        if case == "layer":
            weights = {k.replace("layers.1.", "layers.9."): v for k, v in weights.items()}
        else:
            weights = {k: (v[:-1] if k.endswith("lora_a") else v) for k, v in weights.items()}
        mx.save_safetensors(str(bad / "adapters.safetensors"), weights)
        with pytest.raises(EngineError, match=f"adapter 'bad'.*{says}"):
            Engine(model, adapters={"bad": bad})
    monkey = pytest.MonkeyPatch()
    try:
        monkey.setenv(ADAPTERS_ENV, "a=x,a=y")
        with pytest.raises(EngineError, match=f"{ADAPTERS_ENV} 'a=y': expected NAME=DIR"):
            adapters_from_env()
        monkey.setenv(ADAPTERS_ENV, "fixture")
        assert adapters_from_env() == {"lora": "fixture"}
    finally:
        monkey.undo()


def test_the_http_adapter_sends_the_adapter_as_model_and_the_salt(model: Any) -> None:
    from pytest_prefixcache.adapters.http.openai import OpenAIEngine
    from reference_engine import Engine
    from reference_engine.server import make_server

    srv = make_server(Engine(model, adapters="fixture"), "127.0.0.1", 0, model_name="base")
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    engine = OpenAIEngine(url=url, cold="salt", namespace_field="cache_salt", adapters=("lora",))
    try:
        assert engine.adapters == ("lora",) and "adapter" in stream_kwargs(engine)["moves"]
        assert OpenAIEngine(url=url, cold="salt", namespace_field="cache_salt").adapters == ()
        engine.run(R, use_cache=True)
        assert engine.run(A, use_cache=True).cached_tokens == 0  # another identity
        warm, cold = engine.run(A, use_cache=True), engine.run(A, use_cache=False)
        assert (warm.cached_tokens or 0) > 0 and cold.cached_tokens == 0  # the control
        assert warm.tokens == cold.tokens
        base = engine.run(R, use_cache=False)
        assert base.tokens != cold.tokens  # the adapter ran: its greedy reply differs
        with pytest.raises(EngineError, match="request adapter 'nope' cannot be sent"):
            engine.run(Request(R.messages, adapter="nope"), use_cache=True)
    finally:
        engine.close()
        srv.shutdown()
        srv.server_close()
        thread.join()


def test_the_html_conversation_names_the_adapter(tmp_path: Path) -> None:
    from pytest_prefixcache.html.conversation import render_stream

    (tmp_path / "stream.json").write_text(json.dumps(stream_to_json((R, A), "two identities")))
    page = render_stream(tmp_path, failing=1)
    assert page.count("adapter &#x27;lora&#x27;") + page.count("adapter 'lora'") == 1


ADAPTER_BLIND = """
import time
import numpy as np
from pytest_prefixcache import Outcome

class Sleepy:
    adapters = ("x",)

    def __init__(self, blind):
        self.blind, self.seen = blind, set()

    def reset(self):
        self.seen.clear()

    def run(self, request, *, use_cache):
        scope = request.namespace if self.blind else request.scope
        key = (scope, str(request.messages[0].content[0]))
        hit = use_cache and key in self.seen
        if use_cache:
            self.seen.add(key)
        time.sleep(0.0005 if hit else 0.006)
        return Outcome(logits=np.zeros(8, dtype=np.float32), cached_tokens=64 if hit else 0,
                       prompt_tokens=80)

blind = lambda: Sleepy(True)
keyed = lambda: Sleepy(False)
"""


@pytest.mark.timing
@pytest.mark.parametrize(("engine", "outcome"), [("keyed", "passed"), ("blind", "failed")])
def test_the_option_audits_across_the_engines_adapters(
    pytester: pytest.Pytester, engine: str, outcome: str
) -> None:
    pytester.makepyfile(adapterblind=ADAPTER_BLIND)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-isolation", "-k", "isolation",
        f"--prefixcache-engine=adapterblind:{engine}", "--prefixcache-seed=3",
    )  # fmt: skip
    result.assert_outcomes(**{outcome: 1})
    if outcome == "failed":  # the namespaces pass; the adapter pair leaks
        result.stdout.fnmatch_lines(
            ["E   *IsolationFailure: *reveals whether another identity (adapter 'x') cached*"]
        )
