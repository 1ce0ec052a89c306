"""The timing side channel (bug zoo class 24): the KS test, the verdicts, the plugin option."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_prefixcache import Outcome, Request
from pytest_prefixcache.checks.timing import ALPHA, ks_2samp
from pytest_prefixcache.verify.isolation import audit, timed

pytest_plugins = ["pytester"]


def test_ks_statistic_and_pvalue_match_scipy() -> None:
    from scipy import stats  # the dev extra installs it: missing, this test errors

    rng = np.random.default_rng(0)
    for n, m, shift in ((30, 30, 0.0), (30, 30, 0.5), (17, 40, 1.0), (50, 25, 3.0)):
        a, b = rng.normal(size=n), rng.normal(shift, size=m)
        got = ks_2samp(a, b)
        want = stats.ks_2samp(a, b, method="asymp")
        assert got.statistic == pytest.approx(want.statistic, abs=1e-12)
        en = math.sqrt(n * m / (n + m))
        lam = (en + 0.12 + 0.11 / en) * got.statistic
        assert got.pvalue == pytest.approx(float(stats.kstwobign.sf(lam)), rel=1e-9, abs=1e-15)


def test_ks_edge_cases() -> None:
    same = ks_2samp([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert (same.statistic, same.pvalue) == (0.0, 1.0)
    apart = ks_2samp(list(range(30)), [x + 100.0 for x in range(30)])
    assert apart.statistic == 1.0 and apart.pvalue < 1e-12
    with pytest.raises(ValueError, match="non-empty"):
        ks_2samp([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        ks_2samp([math.nan], [1.0])


class Simulated:
    """A timed engine without a clock: a miss costs ~30 ms, a hit ~4 ms, with jitter."""

    def __init__(self, *, share: bool = False, cache: bool = True) -> None:
        self.share, self.cache = share, cache
        self.seen: set[tuple[str, str]] = set()
        self.rng = np.random.default_rng(7)
        self.resets = 0

    def reset(self) -> None:
        self.seen.clear()
        self.resets += 1

    def __call__(self, request: Request) -> tuple[Outcome, float]:
        text = str(request.messages[0].content[0])
        key = ("", text) if self.share else (request.namespace, text)
        hit = self.cache and key in self.seen
        self.seen.add(key)
        seconds = (0.004 if hit else 0.030) * float(self.rng.uniform(0.8, 1.2))
        logits = np.zeros(4, dtype=np.float32)
        return Outcome(logits=logits, cached_tokens=100 if hit else 0, prompt_tokens=120), seconds


@pytest.mark.parametrize(
    ("engine", "verdict"),
    [
        (Simulated(), "pass"),
        (Simulated(share=True), "leak"),
        (Simulated(cache=False), "inconclusive"),  # no power: never a pass
    ],
    ids=["isolated", "shared-across-namespaces", "no-cache"],
)
def test_verdicts(engine: Simulated, verdict: str) -> None:
    result = audit(engine, reset=engine.reset, samples=20)
    assert result.verdict == verdict
    assert engine.resets == 2
    assert len(result.candidate) == len(result.fresh) == 20
    text = "\n".join(result.lines())
    assert f"alpha={ALPHA:g}" in text and "positive control" in text


def test_audit_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="samples"):
        audit(Simulated(), samples=1)


ENGINES = """
import time
import numpy as np
from pytest_prefixcache import Outcome

class Sleepy:
    def __init__(self, share=False, cache=True):
        self.share, self.cache, self.seen = share, cache, set()

    def reset(self):
        self.seen.clear()

    def run(self, request, *, use_cache):
        text = str(request.messages[0].content[0])
        key = ("", text) if self.share else (request.namespace, text)
        hit = use_cache and self.cache and key in self.seen
        if use_cache:
            self.seen.add(key)
        time.sleep(0.0005 if hit else 0.006)
        return Outcome(logits=np.zeros(8, dtype=np.float32), cached_tokens=64 if hit else 0,
                       prompt_tokens=80)

isolated = Sleepy
shared = lambda: Sleepy(share=True)
no_cache = lambda: Sleepy(cache=False)
"""


def _run(pytester: pytest.Pytester, engine: str) -> pytest.RunResult:
    pytester.makepyfile(sleepy=ENGINES)
    return pytester.runpytest(
        "-p", "no:cacheprovider", "-rs", "--prefixcache-isolation", "-k", "isolation",
        f"--prefixcache-engine=sleepy:{engine}", "--prefixcache-seed=3",
    )  # fmt: skip


@pytest.mark.timing
def test_option_passes_an_isolated_engine(pytester: pytest.Pytester) -> None:
    _run(pytester, "isolated").assert_outcomes(passed=1)


@pytest.mark.timing
def test_option_fails_an_engine_that_shares_across_namespaces(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "shared")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E   *IsolationFailure: isolation: time to first token reveals whether another "
            "namespace cached a prefix*",
            "*across namespaces: KS D=*, p=*",
            "*cached_tokens reported for another identity's prefix: max 64",
            "*replay: * -m pytest --prefixcache-verify --prefixcache-engine=sleepy:shared "
            "--prefixcache-isolation --prefixcache-seed=3 -k isolation",
        ]
    )


@pytest.mark.timing
def test_option_without_power_is_inconclusive_not_a_pass(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "no_cache")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * isolation inconclusive: hits are not measurably*"])


def test_without_the_option_no_isolation_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(sleepy=ENGINES)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-engine=sleepy:isolated",
        "--collect-only", "-q",
    )  # fmt: skip
    assert not any("test_isolation" in line for line in result.outlines)
    assert any("test_request_streams" in line for line in result.outlines)


def _reference(name: str) -> object:
    pytest.importorskip("mlx.core")
    if name == "reference":
        from reference_engine import default_engine

        return default_engine()
    from reference_engine import mutants

    return getattr(mutants, name)()


@pytest.mark.timing
@pytest.mark.parametrize(
    ("name", "verdict"), [("reference", "pass"), ("namespace_missing", "leak")]
)
def test_reference_engine_passes_and_the_namespace_mutant_leaks(name: str, verdict: str) -> None:
    engine = _reference(name)
    result = audit(timed(engine), reset=engine.reset, seed=1)  # type: ignore[arg-type,attr-defined]
    assert result.verdict == verdict, result.lines()
    assert result.control.pvalue < ALPHA
