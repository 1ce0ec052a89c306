"""The cold baseline is verified, not trusted: a fresh instance recomputes a sample of the
uncached requests (the baseline audit), and the coverage table says when it could not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from plugin_support import run_suite, with_fakes

from pytest_prefixcache import Outcome

pytest_plugins = ["pytester"]


@pytest.mark.slow
def test_a_stale_feature_cache_is_caught_and_blamed_on_the_baseline(
    pytester: pytest.Pytester,
) -> None:
    """Negative control: features keyed by image size, shared by both paths, kept across
    reset(). Cached == uncached (both stale), so only a fresh instance sees it."""
    with_fakes(pytester)
    result = run_suite(pytester, "stale_features", "-k", "request_streams", examples=30)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E   *BaselineFailure: cold baseline: the uncached baseline is not cold: a fresh "
            "instance of the engine computes another answer for the same request",
            "E     uncached: step 0, token id *: * vs fresh * (|diff| *)",
            "E     the cached run differs from the fresh instance too: step 0, *",
        ]
    )
    result.stdout.no_fnmatch_line("*EquivalenceFailure*")


def test_the_same_engine_without_the_audit_passes_every_other_check(
    pytester: pytest.Pytester,
) -> None:
    """Given as an instance there is no fresh instance: every other check passes, and the
    verdict says the baseline was not audited instead of PASS."""
    with_fakes(pytester)
    result = run_suite(pytester, "stale_features_instance", "-k", "request_streams", examples=30)
    result.assert_outcomes(passed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            "  cold baseline * 0/* (engine given as an instance: *)",
            "verdict: INCOMPLETE: not checked on every request: cold baseline; *",
            "  cold baseline: * request(s) with engine given as an instance: name a "
            "zero-argument callable that builds the engine *",
        ]
    )


def test_a_correct_engine_is_audited(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "good", "-k", "request_streams", examples=10)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["  cold baseline * [1-9]*/[1-9]*", "verdict: PASS"])


def test_an_equivalence_failure_says_which_side_a_fresh_instance_agrees_with(
    pytester: pytest.Pytester,
) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "ignore_digest", "-k", "request_streams", examples=30)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E   *EquivalenceFailure: equivalence: *",
            "E     a fresh instance agrees with the uncached run: the cached run is wrong",
        ]
    )


def test_a_conftest_engine_is_not_audited_and_says_so(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makeconftest(
        "import pytest, fakeengines\n\n\n@pytest.fixture(scope='session')\n"
        "def prefixcache_engine():\n    return fakeengines.FakeEngine()\n"
    )
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-examples=5",
        "--prefixcache-seed=1", "-k", "request_streams",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["  cold baseline * 0/* (engine from a conftest.py fixture: *)"])


def test_a_request_record_times_the_uncached_run_not_the_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audited fresh run is slow; the record's cold time is still the uncached run's. The
    engine calls are timed on a clock the test moves: only the fresh run advances it."""
    from plugin_engines import FakeEngine

    from pytest_prefixcache import Message, Request
    from pytest_prefixcache.verify import Verifier, VerifyOptions
    from pytest_prefixcache.verify import worker as worker_module
    from pytest_prefixcache.verify.audit import Audit

    class Clock:
        now = 0.0

        def perf_counter(self) -> float:
            return self.now

    clock = Clock()
    monkeypatch.setattr(worker_module, "time", clock)

    class SlowFresh(FakeEngine):
        def run(self, request: Request, *, use_cache: bool) -> Outcome:
            clock.now += 100.0  # the audit's fresh instance takes 100 s on this clock
            return super().run(request, use_cache=use_cache)

    options = VerifyOptions(failures_dir=tmp_path)
    verifier = Verifier(FakeEngine(), options=options, audit=Audit(SlowFresh))
    verifier.run([Request((Message("user", ("hello",)),))])
    (record,) = verifier.report.records
    assert verifier.report.coverage["cold baseline"] == {"applied": 1}
    assert clock.now >= 100.0  # the fresh run did run
    assert record.cold_seconds == 0.0 and record.warm_seconds == 0.0, record


def _ab_stream() -> list:
    from pytest_prefixcache import Image, Message, Request

    a = Image(np.full((64, 64, 3), 10, dtype=np.uint8))
    b = Image(np.full((64, 64, 3), 200, dtype=np.uint8))
    ask = lambda *imgs: Request((Message("user", ("Compare:", *imgs)),), max_new_tokens=2)  # noqa: E731
    # a plain repeat first, then the same images in the other order
    return [ask(a, b), ask(a, b), ask(b, a)]


def test_reordered_images_are_audited_after_a_plain_repeat(tmp_path: Path) -> None:
    """Negative control: an engine whose image features are keyed by the set of images (both
    paths share it, a reset keeps it) answers [B, A] with [A, B]'s features, cached and
    uncached alike, so only a fresh instance tells. A plain repeat before the reorder used
    to spend the audit's one rearranged request: the stream passed."""
    from plugin_engines import FakeEngine

    from pytest_prefixcache.errors import VerificationFailure
    from pytest_prefixcache.verify import Verifier, VerifyOptions
    from pytest_prefixcache.verify.audit import Audit

    options = VerifyOptions(failures_dir=tmp_path)
    buggy = Verifier(
        FakeEngine(stale_order=True),
        options=options,
        audit=Audit(lambda: FakeEngine(stale_order=True)),
    )
    with pytest.raises(VerificationFailure) as info:
        buggy.run(_ab_stream())
    assert info.value.check == "cold baseline"
    # positive control: the correct engine passes the same stream, every request audited
    verifier = Verifier(FakeEngine(), options=options, audit=Audit(FakeEngine))
    verifier.run(_ab_stream())
    assert verifier.report.coverage["cold baseline"] == {"applied": 3}


def test_the_cold_baseline_row_counts_audited_against_all_requests(tmp_path: Path) -> None:
    from plugin_engines import FakeEngine

    from pytest_prefixcache import Message, Request
    from pytest_prefixcache.checks.coverage import NOT_SAMPLED, missing
    from pytest_prefixcache.verify import Verifier, VerifyOptions
    from pytest_prefixcache.verify.audit import Audit

    turns = [Message("user", (f"turn {i}",)) for i in range(3)]
    stream = [Request(tuple(turns[: i + 1])) for i in range(3)]
    verifier = Verifier(
        FakeEngine(), options=VerifyOptions(failures_dir=tmp_path), audit=Audit(FakeEngine)
    )
    verifier.run(stream)
    row = verifier.report.coverage["cold baseline"]
    assert row == {"applied": 1, NOT_SAMPLED: 2}
    assert "cold baseline" not in missing(verifier.report.coverage)  # not a gap


def _opened(text: str, *images: object) -> object:
    from pytest_prefixcache import Message, Request

    return Request((Message("user", (text, *images)),), max_new_tokens=2)  # type: ignore[arg-type]


def test_requests_share_a_fresh_instance_only_when_they_share_nothing() -> None:
    from pytest_prefixcache import Image, Message, Request
    from pytest_prefixcache.verify.audit import shares_nothing

    a = Image(np.full((64, 64, 3), 10, dtype=np.uint8))
    b = Image(np.full((64, 64, 3), 200, dtype=np.uint8))
    assert shares_nothing(_opened("Apples", a), _opened("Bananas", b))  # type: ignore[arg-type]
    assert not shares_nothing(_opened("Apples", a), _opened("Bananas", a))  # type: ignore[arg-type]
    # the same first message: the prompts share a prefix beyond the template
    first = Message("system", ("Apples",))
    one = Request((first, Message("user", ("x",))))
    assert not shares_nothing(one, Request((first, Message("user", ("y",)))))
    assert shares_nothing(one, _opened("Apples"))  # type: ignore[arg-type]  # another role
    # other first messages that open alike share a prefix beyond a few words: not shared
    long = "What colour is this image, and what shape"
    assert not shares_nothing(_opened(long + " A?"), _opened(long + " B?"))  # type: ignore[arg-type]
    assert shares_nothing(_opened("You are a judge"), _opened("You are a clerk"))  # type: ignore[arg-type]
    assert not shares_nothing(_opened("x" * 16 + "A"), _opened("x" * 16 + "B"))  # type: ignore[arg-type]
    assert shares_nothing(_opened("x" * 15 + "A"), _opened("x" * 15 + "B"))  # type: ignore[arg-type]


def test_one_fresh_instance_answers_its_share_of_requests_that_share_nothing(
    tmp_path: Path,
) -> None:
    from plugin_engines import FakeEngine

    from pytest_prefixcache.verify import Verifier, VerifyOptions
    from pytest_prefixcache.verify.audit import Audit

    closed: list[int] = []

    class Closing(FakeEngine):
        def close(self) -> None:
            closed.append(1)

    stream = [_opened(w) for w in ("Apples", "Bananas", "Cherries", "Dates", "Elderberries")]
    audit = Audit(Closing, share=3)
    verifier = Verifier(FakeEngine(), options=VerifyOptions(failures_dir=tmp_path), audit=audit)
    for request in stream:  # each its own stream: the first request of each is audited
        verifier.run([request])  # type: ignore[list-item]
    assert verifier.report.coverage["cold baseline"] == {"applied": 5}
    assert (audit.built, len(closed)) == (2, 1)  # 3 + 2 requests; the second is still held
    audit.close()
    assert len(closed) == 2


def test_a_shared_fresh_instance_still_catches_a_stale_cache_of_reordered_images(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control at share=8: [A, B], [A, B], [B, A] share images, so each gets its own
    fresh instance and the stale set-keyed feature cache is caught. Sharing one instance
    regardless (the rule switched off) lets the fresh instance inherit the stale entry and
    the bug through: the rule is what keeps the amortised audit honest."""
    from plugin_engines import FakeEngine

    from pytest_prefixcache.errors import VerificationFailure
    from pytest_prefixcache.verify import Verifier, VerifyOptions
    from pytest_prefixcache.verify import audit as audit_module

    def verifier() -> Verifier:
        fresh = audit_module.Audit(lambda: FakeEngine(stale_order=True), share=8)
        options = VerifyOptions(failures_dir=tmp_path)
        return Verifier(FakeEngine(stale_order=True), options=options, audit=fresh)

    with pytest.raises(VerificationFailure) as info:
        verifier().run(_ab_stream())
    assert info.value.check == "cold baseline"
    monkeypatch.setattr(audit_module, "shares_nothing", lambda request, earlier: True)
    blind = verifier()
    blind.run(_ab_stream())  # passes: the shared instance answers [B, A] as stale as the rest
    assert blind.audit.built == 1


def test_an_engine_declares_its_share_and_a_bad_one_is_named() -> None:
    from plugin_engines import FakeEngine

    from pytest_prefixcache.errors import EngineError
    from pytest_prefixcache.verify.audit import fresh_share

    engine = FakeEngine()
    assert fresh_share(engine) == 1
    engine.fresh_instance_share = 4  # type: ignore[attr-defined]
    assert fresh_share(engine) == 4
    engine.fresh_instance_share = 0  # type: ignore[attr-defined]
    with pytest.raises(EngineError, match=r"FakeEngine.fresh_instance_share = 0: must be an int"):
        fresh_share(engine)


def test_the_server_presets_read_their_share_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pytest_prefixcache.adapters.presets import audit_share
    from pytest_prefixcache.errors import EngineError

    assert audit_share("PREFIXCACHE_AUDIT_SHARE") == 1
    monkeypatch.setenv("PREFIXCACHE_AUDIT_SHARE", "6")
    assert audit_share("PREFIXCACHE_AUDIT_SHARE") == 6
    monkeypatch.setenv("PREFIXCACHE_AUDIT_SHARE", "none")
    with pytest.raises(EngineError, match="PREFIXCACHE_AUDIT_SHARE='none' is not an integer"):
        audit_share("PREFIXCACHE_AUDIT_SHARE")
