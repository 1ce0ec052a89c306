"""pytest hooks for pytest-prefixcache (options and wiring only; see the other modules).

Cheap to import: neither MLX nor any engine is imported here; the engine is built by the
``prefixcache_engine`` fixture when a test first needs it.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import cast

import pytest

from . import settings as opt
from .errors import VerificationFailure
from .replay import save_stream
from .report import MAX_MESSAGE, FailureRecord, Report
from .state import REPORT_KEY, SETTINGS_KEY, WORKER_KEY, report_of, settings_of
from .suite import ISOLATION_FILE, SUITE_FILE
from .types import Request

pytest_plugins = ["pytest_prefixcache.fixtures"]

SERVER_ENGINE = "pytest_prefixcache.adapters.presets:from_env"
ENGINE_FIXTURES = ("prefixcache_engine", "prefixcache_verifier", "prefixcache_verify")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("prefixcache", "prefix-cache verification (pytest-prefixcache)")
    add = group.addoption
    add(
        "--prefixcache-verify",
        action="store_true",
        default=False,
        help="Add the built-in prefix-cache verification suite to the session",
    )
    add(
        "--prefixcache-engine",
        type=opt.engine_spec,
        default=None,
        metavar="MODULE:ATTR",
        help="Engine under test: an Engine instance or a zero-argument callable returning one "
        f"(default: ini prefixcache_engine, else {opt.DEFAULT_ENGINE})",
    )
    add(
        "--prefixcache-examples",
        type=opt.positive_int,
        default=opt.DEFAULT_EXAMPLES,
        metavar="N",
        help=f"Examples per property (default: {opt.DEFAULT_EXAMPLES}; the state machine runs "
        f"half as many, {opt.STATEFUL_STEPS} steps each)",
    )
    add(
        "--prefixcache-seed",
        type=opt.seed,
        default=None,
        metavar="S",
        help="Seed for the generated streams (default: random, printed in the header)",
    )
    add(
        "--prefixcache-report",
        default=None,
        metavar="PATH",
        help="Write a JSON report: requests, hits, reuse vs oracle, worst difference, failures",
    )
    add(
        "--prefixcache-timeout",
        type=opt.positive_float,
        default=60.0,
        metavar="SECONDS",
        help="Fail an engine call that takes longer, and treat the engine as dead (default: 60)",
    )
    add(
        "--prefixcache-atol",
        type=opt.non_negative_float,
        default=0.0,
        metavar="X",
        help="Absolute tolerance for cached vs uncached logits (default: 0, exact)",
    )
    add(
        "--prefixcache-rtol",
        type=opt.non_negative_float,
        default=0.0,
        metavar="X",
        help="Relative tolerance for cached vs uncached logits (default: 0, exact)",
    )
    add(
        "--prefixcache-kl",
        type=opt.non_negative_float,
        default=None,
        metavar="X",
        help="Use the top-k/KL rule instead: estimated KL per step at most X and top tokens "
        "agreeing (for GPU engines and top_logprobs-only engines)",
    )
    add(
        "--prefixcache-min-efficiency",
        type=opt.fraction,
        default=None,
        metavar="F",
        help="Fail when a stream reuses less than F of what the oracle says was reusable",
    )
    add(
        "--prefixcache-min-speedup",
        type=opt.positive_ratio,
        default=None,
        metavar="X",
        help="Fail when a stream's cache hits are not X times faster than their cold runs",
    )
    add(
        "--prefixcache-isolation",
        action="store_true",
        default=False,
        help="Add the timing side-channel test: time to first token must not reveal another "
        "namespace's cached prefix (KS test; implies --prefixcache-verify)",
    )
    add(
        "--prefixcache-replay",
        default=None,
        metavar="PATH",
        help="Replay exactly the stream saved at PATH (a stream.json or its directory)",
    )
    add(
        "--prefixcache-server-cmd",
        type=opt.server_cmd,
        default=None,
        metavar="CMD",
        help="Verify an OpenAI-compatible server started from CMD ({port} is replaced by an "
        "ephemeral port on 127.0.0.1); more settings by PREFIXCACHE_* variables (see "
        "pytest_prefixcache.adapters.presets.from_env)",
    )
    parser.addini("prefixcache_engine", "Engine under test as MODULE:ATTR", default=None)


def _engine(config: pytest.Config) -> tuple[str, str]:
    value = config.getoption("prefixcache_engine")
    server = config.getoption("prefixcache_server_cmd")
    if value and server:
        raise pytest.UsageError(
            "--prefixcache-server-cmd and --prefixcache-engine both name the engine; give one"
        )
    if value:
        return value, "option"
    if server:
        # read by the zero-argument factory when the engine is built
        os.environ["PREFIXCACHE_SERVER_CMD"] = server
        return SERVER_ENGINE, "--prefixcache-server-cmd"
    ini = config.getini("prefixcache_engine")
    if ini:
        ini = str(ini).strip()
        try:
            return opt.engine_spec(ini), "ini"
        except Exception as exc:
            where = config.inipath or "the ini file"
            raise pytest.UsageError(f"prefixcache_engine in {where}: {exc}") from None
    return opt.DEFAULT_ENGINE, "default"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "prefixcache: a test of the built-in prefix-cache verification suite"
    )
    engine, source = _engine(config)
    given_seed = config.getoption("prefixcache_seed")
    replay = config.getoption("prefixcache_replay")
    invocation = config.invocation_params.dir
    if replay is not None:
        replay_path = Path(replay) if Path(replay).is_absolute() else invocation / replay
        if not replay_path.exists():
            raise pytest.UsageError(f"--prefixcache-replay={replay}: no such file or directory")
    isolation = bool(config.getoption("prefixcache_isolation"))
    s = opt.Settings(
        verify=bool(config.getoption("prefixcache_verify")) or replay is not None or isolation,
        engine=engine,
        engine_source=source,
        examples=config.getoption("prefixcache_examples"),
        seed=opt.Settings.random_seed() if given_seed is None else given_seed,
        seed_given=given_seed is not None,
        report=None
        if config.getoption("prefixcache_report") is None
        else Path(config.getoption("prefixcache_report")),
        timeout=config.getoption("prefixcache_timeout"),
        atol=config.getoption("prefixcache_atol"),
        rtol=config.getoption("prefixcache_rtol"),
        kl=config.getoption("prefixcache_kl"),
        min_efficiency=config.getoption("prefixcache_min_efficiency"),
        min_speedup=config.getoption("prefixcache_min_speedup"),
        replay=None if replay is None else replay_path,
        invocation_dir=invocation,
        isolation=isolation,
    )
    config.stash[SETTINGS_KEY] = s
    config.stash[REPORT_KEY] = Report(seed=s.seed, engine=s.engine, tolerance=_tolerance(s))
    if s.verify and str(SUITE_FILE.parent) not in config.args:
        config.args.append(str(SUITE_FILE.parent))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    s = settings_of(parent.config)
    if (file_path == SUITE_FILE and s.verify) or (file_path == ISOLATION_FILE and s.isolation):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def _tolerance(s: opt.Settings) -> str:
    from .compare import Tolerance

    return Tolerance(s.atol, s.rtol, s.kl).describe()


def pytest_unconfigure(config: pytest.Config) -> None:
    worker = config.stash.get(WORKER_KEY, None)
    if worker is not None:
        worker.close()


def pytest_report_header(config: pytest.Config) -> list[str]:
    s = settings_of(config)
    if not s.verify:
        return []
    return [
        f"prefixcache: engine {s.engine} ({s.engine_source}), {s.examples} examples per "
        f"property, tolerance {_tolerance(s)}, timeout {s.timeout:g} s",
        f"prefixcache: using --prefixcache-seed={s.seed}",
    ]


def _is_suite(item: pytest.Item) -> bool:
    return Path(str(item.path)) in (SUITE_FILE, ISOLATION_FILE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    s = settings_of(config)
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        if _is_suite(item):
            item.add_marker(pytest.mark.prefixcache)
            is_replay = getattr(item, "originalname", item.name) == "test_replay"
            (keep if is_replay == (s.replay is not None) else drop).append(item)
        elif s.replay is not None:
            drop.append(item)  # a replay runs exactly the saved stream, nothing else
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_runtest_setup(item: pytest.Item) -> None:
    worker = item.config.stash.get(WORKER_KEY, None)
    fixturenames = getattr(item, "fixturenames", ())
    if worker is not None and worker.dead and any(f in fixturenames for f in ENGINE_FIXTURES):
        pytest.skip(f"the engine is dead ({worker.dead}); remaining checks skipped")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    exc = call.excinfo.value if call.excinfo is not None else None
    if report.failed and isinstance(exc, VerificationFailure) and exc.stream:
        s = settings_of(item.config)
        path = exc.replay_path
        if path:
            try:
                save_stream(
                    cast("tuple[Request, ...]", exc.stream),
                    Path(path).parent,
                    check=exc.check,
                    **exc.meta,
                    seed=s.seed,
                )
            except OSError as err:
                path = f"(could not save {path}: {err})"
        summary = str(exc).splitlines()[0] if str(exc) else exc.check
        command = s.replay_command(path) if path else None
        stream_dir = None if not exc.replay_path else str(Path(exc.replay_path).parent.resolve())
        report_of(item.config).failures.append(
            FailureRecord(
                exc.check, item.nodeid, summary, command, str(exc)[:MAX_MESSAGE],
                stream_dir if path == exc.replay_path else None, exc.request_index,
            )
        )  # fmt: skip
        if command:
            report.sections.append(("prefixcache replay", command))
    return report


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    s = settings_of(config)
    rep = report_of(config)
    if not (s.verify or rep.requests or rep.failures):
        return
    terminalreporter.write_sep("=", "prefixcache")
    for line in rep.lines():
        terminalreporter.write_line(line)
    if s.report is not None:
        path = s.report if s.report.is_absolute() else s.invocation_dir / s.report
        rep.write_json(path)
        terminalreporter.write_line(f"JSON report written to {path}")
