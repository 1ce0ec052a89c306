"""Every command-line option and the ini key: parsing, errors that name the bad value, effect."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
from plugin_support import REPLAY_LINE, run_file, run_suite, with_fakes

from pytest_prefixcache import EngineError
from pytest_prefixcache.session import settings
from pytest_prefixcache.session.fixtures import load_engine
from pytest_prefixcache.session.stash import SETTINGS_KEY

pytest_plugins = ["pytester"]


# -- unit: the type= validators ------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "bad", "says"),
    [
        (settings.positive_int, "abc", "'abc' is not a positive integer"),
        (settings.positive_int, "0", "'0' is not a positive integer"),
        (settings.seed, "-3", "'-3' is not an integer from 0 to 2**63 - 1"),
        (settings.positive_float, "0", "'0' is not a positive number of seconds"),
        (settings.positive_float, "inf", "'inf' is not a positive number of seconds"),
        (settings.non_negative_float, "-1e-3", "'-1e-3' is not a finite number >= 0"),
        (settings.non_negative_float, "nan", "'nan' is not a finite number >= 0"),
        (settings.fraction, "1.5", "'1.5' is not a number from 0 to 1"),
        (settings.engine_spec, "nocolon", "'nocolon' is not MODULE:ATTR"),
        (settings.engine_spec, "a:b:c", "'a:b:c' is not MODULE:ATTR"),
    ],
)
def test_validators_repeat_the_bad_value(fn: object, bad: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        fn(bad)  # type: ignore[operator]
    assert str(info.value).startswith(says)


def test_validators_accept_good_values() -> None:
    assert settings.positive_int("7") == 7
    assert settings.seed("0") == 0
    assert settings.positive_float("0.5") == 0.5
    assert settings.non_negative_float("0") == 0.0
    assert settings.fraction("1") == 1.0
    assert settings.engine_spec("pkg.mod:obj.attr") == "pkg.mod:obj.attr"


# -- option errors on the command line -----------------------------------------------------


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("--prefixcache-examples=many", "--prefixcache-examples: 'many' is not a positive integer"),
        ("--prefixcache-seed=x1", "--prefixcache-seed: 'x1' is not an integer*"),
        ("--prefixcache-timeout=-5", "--prefixcache-timeout: '-5' is not a positive number*"),
        ("--prefixcache-atol=big", "--prefixcache-atol: 'big' is not a finite number >= 0"),
        ("--prefixcache-rtol=-1", "--prefixcache-rtol: '-1' is not a finite number >= 0"),
        ("--prefixcache-kl=none", "--prefixcache-kl: 'none' is not a finite number >= 0"),
        ("--prefixcache-min-efficiency=2", "--prefixcache-min-efficiency: '2' is not a number *"),
        ("--prefixcache-min-speedup=0", "--prefixcache-min-speedup: '0' is not a positive number"),
        ("--prefixcache-engine=engine.py", "--prefixcache-engine: 'engine.py' is not MODULE:ATTR*"),
    ],
)  # fmt: skip
def test_bad_option_values_are_usage_errors(pytester: pytest.Pytester, arg: str, says: str) -> None:
    result = pytester.runpytest(arg)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*error: argument {says}*"])


def test_replay_of_a_missing_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--prefixcache-replay=nowhere/stream.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--prefixcache-replay=nowhere/stream.json: no such file or directory*"]
    )


def test_bad_ini_engine_names_the_value_and_the_file(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nprefixcache_engine = not-a-spec\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*prefixcache_engine in *tox.ini: 'not-a-spec' is not MODULE:ATTR*"]
    )


# -- option interplay (parseconfigure) ------------------------------------------------------


def test_defaults(pytester: pytest.Pytester) -> None:
    s = pytester.parseconfigure().stash[SETTINGS_KEY]
    assert (s.verify, s.engine, s.engine_source) == (False, settings.DEFAULT_ENGINE, "default")
    assert (s.examples, s.timeout, s.atol, s.rtol, s.kl) == (
        settings.DEFAULT_EXAMPLES,
        60.0,
        0,
        0,
        None,
    )
    assert s.min_efficiency is None and s.replay is None and not s.seed_given


def test_options_reach_the_settings(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfigure(
        "--prefixcache-verify",
        "--prefixcache-engine=fakeengines:good",
        "--prefixcache-examples=3",
        "--prefixcache-seed=42",
        "--prefixcache-timeout=2.5",
        "--prefixcache-atol=1e-5",
        "--prefixcache-rtol=1e-4",
        "--prefixcache-min-efficiency=0.5",
    )
    s = config.stash[SETTINGS_KEY]
    assert (s.verify, s.engine, s.engine_source, s.examples) == (
        True,
        "fakeengines:good",
        "option",
        3,
    )
    assert (s.seed, s.seed_given, s.timeout, s.atol, s.rtol) == (42, True, 2.5, 1e-5, 1e-4)
    assert s.min_efficiency == 0.5
    assert s.replay_command("x/stream.json") == (
        f"{sys.executable} -m pytest --prefixcache-verify --prefixcache-engine=fakeengines:good "
        "--prefixcache-atol=1e-05 --prefixcache-rtol=0.0001 --prefixcache-min-efficiency=0.5 "
        "--prefixcache-timeout=2.5 "
        "--prefixcache-replay=x/stream.json"
    )


def test_command_line_engine_beats_the_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nprefixcache_engine = fakeengines:good\n")
    assert pytester.parseconfigure().stash[SETTINGS_KEY].engine_source == "ini"
    s = pytester.parseconfigure("--prefixcache-engine=other:thing").stash[SETTINGS_KEY]
    assert (s.engine, s.engine_source) == ("other:thing", "option")


def test_replay_implies_verify(pytester: pytest.Pytester) -> None:
    stream = {"format": "pytest-prefixcache/stream/v1", "requests": [{"messages": [
        {"role": "user", "content": ["hi"]}]}]}  # fmt: skip
    path = pytester.makefile(".json", stream=json.dumps(stream))
    s = pytester.parseconfigure(f"--prefixcache-replay={path}").stash[SETTINGS_KEY]
    assert s.verify and s.replay == path


# -- options end to end ---------------------------------------------------------------------


def test_header_prints_the_reproducing_seed(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "good", "-k", "nothing-matches")
    result.stdout.fnmatch_lines(
        [
            "prefixcache: engine fakeengines:good (option), 5 examples per property, tolerance "
            "exact or the engine's own rule, timeout 60 s",
            "prefixcache: using --prefixcache-seed=1",
        ]
    )


def test_random_seed_is_printed_when_not_given(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = pytester.runpytest(
        "--prefixcache-verify", "--prefixcache-engine=fakeengines:good", "-k", "nothing-matches"
    )
    result.stdout.fnmatch_lines(["prefixcache: using --prefixcache-seed=*"])
    result.stdout.re_match_lines([r"reproduce with --prefixcache-seed=\d+"])


def test_ini_engine_is_used(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makeini("[pytest]\nprefixcache_engine = fakeengines:good\n")
    result = pytester.runpytest(
        "--prefixcache-verify", "--prefixcache-examples=2", "-k", "request_streams"
    )
    result.stdout.fnmatch_lines(["prefixcache: engine fakeengines:good (ini)*"])
    result.assert_outcomes(passed=1)


def _report(pytester: pytest.Pytester, engine: str, *args: str) -> dict[str, object]:
    run_suite(pytester, engine, "-k", "request_streams", "--prefixcache-report=r.json", *args)
    return json.loads((pytester.path / "r.json").read_text())  # type: ignore[no-any-return]


def test_examples_sets_examples_per_property(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    assert _report(pytester, "good", "--prefixcache-examples=3")["streams"] == 3
    assert _report(pytester, "good", "--prefixcache-examples=7")["streams"] == 7


def test_same_seed_same_streams_other_seed_other_streams(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    keys = ("requests", "reused_tokens", "oracle_tokens", "merges_checked")
    a = _report(pytester, "good", "--prefixcache-seed=5")
    b = _report(pytester, "good", "--prefixcache-seed=5")
    c = _report(pytester, "good", "--prefixcache-seed=6")
    assert [a[k] for k in keys] == [b[k] for k in keys]
    assert [a[k] for k in keys] != [c[k] for k in keys]


def test_atol_accepts_small_absolute_drift(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    run_suite(pytester, "drift", "-k", "request_streams").assert_outcomes(failed=1)
    result = run_suite(pytester, "drift", "-k", "request_streams", "--prefixcache-atol=1e-5")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["engine: fakeengines:drift; tolerance: atol=1e-05, rtol=0"])


def test_an_engine_brings_its_own_tolerance_and_an_option_overrides_it(
    pytester: pytest.Pytester,
) -> None:
    with_fakes(pytester)
    own = run_suite(pytester, "drift_with_atol", "-k", "request_streams")
    own.assert_outcomes(passed=1)
    own.stdout.fnmatch_lines(
        ["engine: fakeengines:drift_with_atol; tolerance: atol=1e-05, rtol=0 (the engine's own*"]
    )
    strict = run_suite(
        pytester, "drift_with_atol", "-k", "request_streams", "--prefixcache-rtol=1e-9"
    )
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(
        ["engine: fakeengines:drift_with_atol; tolerance: atol=0, rtol=1e-09"]
    )


def test_rtol_accepts_small_relative_drift(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    run_suite(pytester, "scale_drift", "-k", "request_streams").assert_outcomes(failed=1)
    result = run_suite(pytester, "scale_drift", "-k", "request_streams", "--prefixcache-rtol=1e-5")
    result.assert_outcomes(passed=1)


@pytest.mark.slow
def test_kl_rule_accepts_drift_and_still_catches_wrong_reuse(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    ok = run_suite(pytester, "drift", "-k", "request_streams", "--prefixcache-kl=0.001")
    ok.assert_outcomes(passed=1)
    ok.stdout.fnmatch_lines(["*tolerance: KL <= 0.001 with top-token agreement"])
    bad = run_suite(
        pytester, "ignore_digest", "-k", "request_streams", "--prefixcache-kl=0.001", examples=30
    )
    bad.assert_outcomes(failed=1)
    bad.stdout.fnmatch_lines(
        ["E   *EquivalenceFailure: equivalence: step 0: estimated KL * (limit 0.001)*"]
    )


def test_min_efficiency_catches_a_cache_that_keeps_too_little(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    run_suite(pytester, "store_half", "-k", "request_streams").assert_outcomes(passed=1)
    result = run_suite(
        pytester, "store_half", "-k", "request_streams", "--prefixcache-min-efficiency=0.9"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E   *EfficiencyFailure: min efficiency: the cache reused * of * reusable tokens "
            "(*%), below --prefixcache-min-efficiency=0.9",
            "*the cache invalidates more than it must*",
            f"*replay: {REPLAY_LINE}",
        ]
    )
    assert run_file(pytester.path)["flags"] == [
        "--prefixcache-verify", "--prefixcache-engine=fakeengines:store_half",
        "--prefixcache-min-efficiency=0.9",
    ]  # fmt: skip


def test_engine_instance_attribute_is_used_as_is(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    run_suite(pytester, "instance", "-k", "request_streams").assert_outcomes(passed=1)


def test_engine_module_that_does_not_exist(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        "--prefixcache-verify", "--prefixcache-engine=nosuchmodule:engine", "-k", "request_streams"
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*EngineError: cannot import 'nosuchmodule' for engine 'nosuchmodule:engine': No module*"]
    )


def test_engine_attribute_that_does_not_exist(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(pytester, "missing", "-k", "request_streams")
    result.stdout.fnmatch_lines(
        ["*EngineError: engine 'fakeengines:missing': <module*has no attribute 'missing'*"]
    )


def test_default_engine_missing_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reference_engine", None)
    with pytest.raises(
        EngineError, match=r"needs the mlx extra \(pip install 'pytest-prefixcache\[mlx\]'\)"
    ):
        load_engine(settings.DEFAULT_ENGINE)


def test_report_json_lists_failures_with_their_replay(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    result = run_suite(
        pytester, "lie", "-k", "request_streams", "--prefixcache-report=out/report.json"
    )
    result.stdout.fnmatch_lines(["JSON report written to */out/report.json"])
    data = json.loads((pytester.path / "out" / "report.json").read_text())
    assert data["seed"] == 1 and data["engine"] == "fakeengines:lie"
    assert data["failures_by_check"] == {"reuse bound": 1}
    [failure] = data["failures"]
    assert failure["test"] == "verification.py::test_request_streams"
    assert failure["summary"].startswith("reuse bound: cached_tokens=8 exceeds")
    assert failure["replay"].startswith(f"{sys.executable} -m pytest_prefixcache.cli replay ")
    assert data["run"]["flags"] == ["--prefixcache-verify", "--prefixcache-engine=fakeengines:lie"]
    assert data["run_file"] and json.loads(Path(data["run_file"]).read_text()) == data["run"]
    assert {"requests", "cache_hits", "reused_tokens", "oracle_tokens", "efficiency",
            "worst_diff", "merges_checked"} <= set(data)  # fmt: skip


@pytest.mark.timing
def test_min_speedup_catches_a_cache_slower_than_no_cache(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    # A corpus scenario, not generated streams: timing checks and shrinking do not mix.
    run_suite(pytester, "slow_hits", "-k", "agent_loop").assert_outcomes(passed=1)
    result = run_suite(pytester, "slow_hits", "-k", "agent_loop", "--prefixcache-min-speedup=1.0")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E   *SpeedupFailure: min speedup: requests served from the cache took * s against "
            "* s cold (speedup *x), below --prefixcache-min-speedup=1",
            "*measured on: whole calls (the engine reports no time to first token)",
            "*restoring or managing the cache costs more than the prefill it saves",
            "time on cache hits (whole calls, * hit(s) reporting no time to first token): "
            "* s warm vs * s cold (speedup *x)",
        ]
    )
