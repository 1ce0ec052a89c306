"""Scale-out: pytest-xdist shards with merged reports, the example database (directory and a
real Redis server on loopback), --prefixcache-budget rounds and progress lines."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from xml.etree import ElementTree

import pytest
from plugin_support import run_suite, with_fakes

pytest_plugins = ["pytester"]

xdist = pytest.importorskip("xdist", reason="pytest-xdist is not installed (dev extra)")


def _report(pytester: pytest.Pytester, name: str = "r.json") -> dict:
    return json.loads((pytester.path / name).read_text())


def _streams(report: dict) -> Counter:
    """The multiset of requests run (prompt length, reported reuse): same streams, same set."""
    return Counter((r["prompt_tokens"], r["cached_tokens"]) for r in report["records"])


def _junit_properties(pytester: pytest.Pytester, name: str) -> dict[str, str]:
    """The test-suite properties of a JUnit file; a name written twice fails."""
    root = ElementTree.parse(pytester.path / name).getroot()
    props = [(p.get("name"), p.get("value")) for p in root.iter("property")]
    found = {str(k): str(v) for k, v in props}
    assert len(found) == len(props), props
    return found


@pytest.mark.slow
def test_xdist_splits_the_streams_and_merges_the_reports(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    args = ("-k", "request_streams or state_machine", "--prefixcache-database=none")
    dist = run_suite(pytester, "good", *args, "-n", "2", "--prefixcache-report=d.json",
                     "--junitxml=d.xml", examples=10, subprocess=True)  # fmt: skip
    dist.assert_outcomes(passed=4)
    out = dist.stdout.str()
    assert "on 2 workers" in out
    assert "reproduce with --prefixcache-seed=1 --prefixcache-shards=2" in out
    merged = _report(pytester, "d.json")
    assert merged["workers"] == 2 and merged["shards"] == 2 and merged["seed"] == 1
    assert {r["worker"] for r in merged["records"]} == {"gw0", "gw1"}
    assert merged["requests"] == len(merged["records"]) > 0
    # the controller's JUnit file carries the merged verdict and coverage, once
    assert _junit_properties(pytester, "d.xml") == {
        "prefixcache_verdict": merged["verdict"],
        **{
            f"prefixcache_coverage: {check}": f"{row.get('applied', 0)}/{sum(row.values())}"
            for check, row in merged["coverage"].items()
        },
    }

    # the same shards in one process run exactly the same streams: a shard is reproducible
    # without xdist, and the two workers did not run the same seed. (In a subprocess, as the
    # workers: Hypothesis also draws constants from the local modules loaded, so an in-process
    # run after other tests' modules were imported generates other streams from the same seed.)
    local = run_suite(pytester, "good", *args, "--prefixcache-shards=2",
                      "--prefixcache-report=l.json", examples=10, subprocess=True)  # fmt: skip
    local.assert_outcomes(passed=4)
    single = _report(pytester, "l.json")
    assert _streams(single) == _streams(merged)
    assert single["requests"] == merged["requests"]
    gw0, gw1 = (
        _streams({"records": [r for r in merged["records"] if r["worker"] == w]})
        for w in ("gw0", "gw1")
    )
    assert gw0 != gw1


@pytest.mark.slow
def test_xdist_failures_reach_the_controller(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    res = run_suite(pytester, "ignore_digest", "-k", "request_streams", "-n", "2",
                    "--prefixcache-database=none", "--prefixcache-report=r.json",
                    "--junitxml=f.xml", examples=30, subprocess=True)  # fmt: skip
    assert res.ret == 1
    out = res.stdout.str()
    assert "failures by check: equivalence" in out
    assert "-m pytest_prefixcache.cli replay --run=" in out
    rep = _report(pytester)
    assert _junit_properties(pytester, "f.xml")["prefixcache_verdict"] == "fail"
    assert rep["failures"] and {f["worker"] for f in rep["failures"]} <= {"gw0", "gw1"}
    assert all(Path(f["stream_dir"], "stream.json").is_file() for f in rep["failures"])


def _run_db(pytester: pytest.Pytester, db: str, examples: int, seed: int) -> pytest.RunResult:
    return pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify",
        "--prefixcache-engine=fakeengines:ignore_digest",
        f"--prefixcache-examples={examples}", f"--prefixcache-seed={seed}",
        f"--prefixcache-database={db}", "-k", "request_streams",
    )  # fmt: skip


@pytest.mark.slow
def test_directory_database_replays_a_failure_first(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    # negative control: one example from this seed does not find the bug on its own
    _run_db(pytester, "none", examples=1, seed=2).assert_outcomes(passed=1)
    _run_db(pytester, "db", examples=40, seed=1).assert_outcomes(failed=1)
    assert any((pytester.path / "db").rglob("*"))
    _run_db(pytester, "db", examples=1, seed=2).assert_outcomes(failed=1)
    _run_db(pytester, "none", examples=1, seed=2).assert_outcomes(passed=1)


@pytest.mark.slow
def test_default_database_is_under_dot_prefixcache(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    res = run_suite(pytester, "ignore_digest", "-k", "request_streams", examples=40)
    res.assert_outcomes(failed=1)
    assert "example database .prefixcache/examples" in res.stdout.str()
    assert any((pytester.path / ".prefixcache" / "examples").iterdir())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("http://example.invalid/db", "only redis://, rediss:// and unix:// URLs"),
        ("redis://127.0.0.1:1/0", "cannot reach Redis"),
    ],
)
def test_bad_database_is_a_usage_error(pytester: pytest.Pytester, value: str, message: str) -> None:
    with_fakes(pytester)
    res = run_suite(pytester, "good", f"--prefixcache-database={value}")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert message in res.stderr.str() and "--prefixcache-database" in res.stderr.str()


def test_database_that_is_a_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makefile(".txt", db="not a directory")
    res = run_suite(pytester, "good", "--prefixcache-database=db.txt")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "is a file, not a directory" in res.stderr.str()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A real redis-server on 127.0.0.1 (an ephemeral port), stopped by its PID."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does)")
    pytest.importorskip("redis", reason="the redis package is not installed (dev extra)")
    import redis

    for _ in range(5):
        port = _free_port()
        proc = subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(tmp_path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(port=port, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        if proc.poll() is None:
            break
    else:
        pytest.fail("redis-server did not start on a free port in 5 tries")
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.slow
def test_redis_database_shares_failures_between_machines(
    pytester: pytest.Pytester,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import redis

    with_fakes(pytester)
    _run_db(pytester, redis_url, examples=40, seed=1).assert_outcomes(failed=1)
    keys = redis.Redis.from_url(redis_url).keys("pytest-prefixcache:*")
    assert keys, "the failing example was not saved to Redis"
    # "another machine": a fresh directory with nothing saved locally
    other = tmp_path_factory.mktemp("machine2")
    shutil.copy(pytester.path / "fakeengines.py", other)
    monkeypatch.chdir(other)
    _run_db(pytester, "none", examples=1, seed=2).assert_outcomes(passed=1)
    _run_db(pytester, redis_url, examples=1, seed=2).assert_outcomes(failed=1)
    assert not (other / ".prefixcache" / "examples").exists()


@pytest.mark.timing
def test_budget_runs_more_rounds_until_spent(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    args = ("-k", "request_streams", "--prefixcache-database=none")
    run_suite(pytester, "good", *args, "--prefixcache-report=one.json", examples=2)
    start = time.monotonic()
    run_suite(pytester, "good", *args, "--prefixcache-budget=3", "--prefixcache-report=b.json",
              examples=2).assert_outcomes(passed=1)  # fmt: skip
    assert time.monotonic() - start >= 3 * 0.6
    # more than one round ran (how many depends on how busy the machine is)
    assert _report(pytester, "b.json")["streams"] > _report(pytester, "one.json")["streams"]


def test_progress_lines(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    args = ("-k", "request_streams", "--prefixcache-database=none")
    noisy = run_suite(pytester, "good", *args, "--prefixcache-progress=0.000001", examples=5)
    lines = [
        ln for ln in noisy.stdout.lines if ln.startswith("prefixcache: ") and "requests (" in ln
    ]
    assert len(lines) >= 3
    assert "with cache hits) in" in lines[-1] and "failed test(s)" in lines[-1]
    quiet = run_suite(pytester, "good", *args, "--prefixcache-progress=0", examples=5)
    assert not [ln for ln in quiet.stdout.lines if "with cache hits) in" in ln]


def test_the_corpus_runs_once_per_session_not_once_per_shard(pytester: pytest.Pytester) -> None:
    """Shards split the generated tests only: the corpus is the same fixed scenarios whatever
    the seed, so each runs once (under xdist, on one worker: an item runs once)."""
    with_fakes(pytester)

    def items(*args: str) -> list[str]:
        result = run_suite(pytester, "good", "--collect-only", "-q", *args)
        return [line for line in result.outlines if "::test_" in line]

    one, three = items(), items("--prefixcache-shards=3")
    corpus = [i for i in one if "::test_corpus[" in i]
    assert corpus and [i for i in three if "::test_corpus[" in i] == corpus
    assert len(three) - len(corpus) == 3 * (len(one) - len(corpus))  # negative control
