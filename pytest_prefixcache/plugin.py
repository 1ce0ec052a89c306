"""pytest hooks for pytest-prefixcache (options and wiring only; see the other modules).

Cheap to import: neither MLX nor any engine is imported here; the engine is built by the
``prefixcache_engine`` fixture when a test first needs it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Generator
from contextlib import nullcontext
from pathlib import Path

import pytest

from .errors import PrefixCacheError
from .output.report import Report
from .output.run_file import recorded_environment
from .output.streams import load_stream
from .package_data import MODEL_ENV
from .session import option_table, settings
from .session import xdist as xd
from .session.database import DatabaseError, example_database
from .session.failures import (
    ENGINE_ERROR,
    FailedTests,
    is_flaky,
    record,
    record_skip,
    verification_failures,
)
from .session.progress import Progress
from .session.run_record import run_file_of
from .session.slots import (
    CONFIG_PARAM,
    SLOTS_KEY,
    assemble,
    is_matrix,
    make_slots,
    matrix_header,
    order_by_config,
    slot_of,
    slots_of,
)
from .session.sources import SERVER_SOURCE, engine_of, model_of
from .session.stash import (
    DATABASE_KEY,
    PROGRESS_KEY,
    REPORT_KEY,
    SETTINGS_KEY,
    START_KEY,
    WORKER_KEY,
    report_of,
    settings_of,
)
from .suite import ISOLATION_FILE, RESTARTS_FILE, SUITE_FILE

pytest_plugins = ["pytest_prefixcache.session.options", "pytest_prefixcache.session.fixtures"]

#: Why the suite's tests left out of this run were deselected (printed after collection).
DESELECTED_KEY = pytest.StashKey[str]()
#: PREFIXCACHE_MODEL as it was before this session exported its model (None: unset).
MODEL_ENV_KEY = pytest.StashKey["str | None"]()
#: The reference engine's disk tier directory under --prefixcache-restarts (DISK_ENV).
DISK_ENV = "PREFIXCACHE_REFERENCE_DISK"
DISK_ENV_KEY = pytest.StashKey["tuple[str | None, str]"]()
#: The variables a --prefixcache-server-cmd session exports, as they were before it.
SERVER_ENV = ("PREFIXCACHE_SERVER_CMD", "PREFIXCACHE_EXTRA_BODY")
SERVER_ENV_KEY = pytest.StashKey["dict[str, str | None]"]()
ENGINE_FIXTURES = ("prefixcache_engine", "prefixcache_verifier", "prefixcache_verify")
#: The exit status of a session whose engine could not be built (as ``prefixcache verify``'s).
ENGINE_ERROR_EXIT = 2


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "prefixcache: a test of the built-in prefix-cache verification suite"
    )
    environment = tuple(recorded_environment(os.environ).items())  # before the exports below
    # engine_of exports --prefixcache-server-cmd (and its body) for the factory that reads them
    config.stash[SERVER_ENV_KEY] = {k: os.environ.get(k) for k in SERVER_ENV}
    engine, source, targets = engine_of(config)
    model, model_source = model_of(config)
    if model is not None:  # every engine factory, server subprocess and fresh instance reads it
        config.stash[MODEL_ENV_KEY] = os.environ.get(MODEL_ENV)
        os.environ[MODEL_ENV] = model
    given_seed = config.getoption("prefixcache_seed")
    worker = xd.worker_input(config)
    if xd.SEED in worker:  # an xdist worker runs the controller's seed
        given_seed = worker[xd.SEED] if given_seed is None else given_seed
    replay = config.getoption("prefixcache_replay")
    invocation = config.invocation_params.dir
    if replay is not None:
        replay_path = Path(replay) if Path(replay).is_absolute() else invocation / replay
        if not replay_path.exists():
            raise pytest.UsageError(f"--prefixcache-replay={replay}: no such file or directory")
        try:
            load_stream(replay_path)
        except PrefixCacheError as exc:  # malformed: a usage error naming the file and field
            raise pytest.UsageError(f"--prefixcache-replay={replay}: {exc}") from None
    isolation = bool(config.getoption("prefixcache_isolation"))
    s = settings.Settings(
        **option_table.settings_values(config.getoption),
        verify=bool(config.getoption("prefixcache_verify"))
        or replay is not None
        or isolation
        or bool(config.getoption("prefixcache_restarts")),
        engine=engine,
        engine_source=source,
        model=model,
        model_source=model_source,
        server_cmd=os.environ["PREFIXCACHE_SERVER_CMD"] if source == SERVER_SOURCE else None,
        seed=settings.Settings.random_seed() if given_seed is None else given_seed,
        seed_given=given_seed is not None,
        replay=None if replay is None else replay_path,
        invocation_dir=invocation,
        isolation=isolation,
        # a matrix distributes configurations over xdist workers, not shards
        shards=config.getoption("prefixcache_shards")
        or (1 if targets else xd.worker_count(config)),
        database=config.getoption("prefixcache_database")
        or _env_database()
        or settings.DEFAULT_DATABASE,
        environment=environment,
    )
    config.stash[SETTINGS_KEY] = s
    config.stash[REPORT_KEY] = Report(
        seed=s.seed,
        engine=s.engine if s.server_cmd is None else f"{s.engine} serving {s.server_cmd}",
        model=s.model,
        tolerance=_tolerance(s),
        shards=s.shards,
        parallel_streams=s.parallel_streams,
        allow_partial=s.allow_partial,
    )
    config.stash[REPORT_KEY].run = run_file_of(s, config.stash[REPORT_KEY]).to_json()
    make_slots(config, targets)
    progress = Progress(0.0 if xd.is_worker(config) else s.progress, _writer(config))
    config.stash[PROGRESS_KEY] = progress
    if s.verify:
        try:
            config.stash[DATABASE_KEY] = example_database(s.database, invocation)
        except DatabaseError as exc:
            raise pytest.UsageError(str(exc)) from None
    if s.verify and not xd.is_worker(config):
        config.pluginmanager.register(FailedTests(), "prefixcache-failed")
    if config.pluginmanager.hasplugin("xdist") and not xd.is_worker(config):
        config.pluginmanager.register(xd.Controller(config, progress), "prefixcache-xdist")
    if s.restarts:  # the reference engine's disk tier (default_engine), removed at the end
        config.stash[DISK_ENV_KEY] = (os.environ.get(DISK_ENV), tempfile.mkdtemp(prefix="pckv-"))
        os.environ[DISK_ENV] = config.stash[DISK_ENV_KEY][1]
    if s.verify and str(SUITE_FILE.parent) not in config.args:
        config.args.append(str(SUITE_FILE.parent))


def _env_database() -> str | None:
    value = os.environ.get("PREFIXCACHE_DATABASE")
    if not value:
        return None
    try:
        return settings.database_spec(value)
    except Exception as exc:
        raise pytest.UsageError(f"PREFIXCACHE_DATABASE: {exc}") from None


def _writer(config: pytest.Config) -> Callable[[str], None]:
    """Write a line to the terminal, even while a test's output is being captured."""

    def write(line: str) -> None:
        tr = config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return
        capman = config.pluginmanager.get_plugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman else nullcontext():
            tr.write_line(line)

    return write


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    s = settings_of(parent.config)
    if (
        (file_path == SUITE_FILE and s.verify)
        or (file_path == ISOLATION_FILE and s.isolation)
        or (file_path == RESTARTS_FILE and s.restarts)
    ):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def _tolerance(s: settings.Settings, header: bool = False) -> str:
    """The options' tolerance; in the header, with none given: exact unless the engine declares
    its measured rule (known once it is built: the summary names the one judged by)."""
    from .checks.equivalence import Tolerance

    options = Tolerance(s.atol, s.rtol, s.kl)
    return "exact or the engine's own rule" if header and options.exact else options.describe()


def pytest_unconfigure(config: pytest.Config) -> None:
    if DISK_ENV_KEY in config.stash:
        previous, directory = config.stash[DISK_ENV_KEY]
        shutil.rmtree(directory, ignore_errors=True)
        if previous is None:
            os.environ.pop(DISK_ENV, None)
        else:
            os.environ[DISK_ENV] = previous
    if MODEL_ENV_KEY in config.stash:  # as it was: a session run in-process leaves no trace
        previous = config.stash[MODEL_ENV_KEY]
        if previous is None:
            os.environ.pop(MODEL_ENV, None)
        else:
            os.environ[MODEL_ENV] = previous
    for name, value in config.stash.get(SERVER_ENV_KEY, {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    worker = config.stash.get(WORKER_KEY, None)
    if worker is not None:
        worker.close()
    for slot in config.stash.get(SLOTS_KEY, {}).values():
        if slot.worker is not worker:
            slot.worker.close()


def pytest_report_header(config: pytest.Config) -> list[str]:
    s = settings_of(config)
    if not s.verify:
        return []
    model = f"model {s.model} ({s.model_source}), " if s.model is not None else ""
    lines = matrix_header(config) or [
        f"prefixcache: engine {s.engine} ({s.engine_source}), {model}{s.examples} examples "
        f"per property, tolerance {_tolerance(s, header=True)}, timeout {s.timeout:g} s"
    ]
    lines += [
        f"prefixcache: using {s.seed_command()}",
        f"prefixcache: example database {s.database}",
    ]
    if s.shards > 1:
        lines.append(
            f"prefixcache: generated tests split into {s.shards} shards (seeds derived from "
            f"{s.seed}; examples {s.shard_examples()} per shard)"
        )
    if s.budget:
        lines.append(f"prefixcache: budget {s.budget:g} s of new rounds of examples")
    return lines


def _is_suite(item: pytest.Item) -> bool:
    return Path(str(item.path)) in (SUITE_FILE, ISOLATION_FILE, RESTARTS_FILE)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if CONFIG_PARAM in metafunc.fixturenames and is_matrix(metafunc.config):
        names = list(slots_of(metafunc.config))
        metafunc.parametrize(CONFIG_PARAM, names, indirect=True, scope="session", ids=names)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if is_matrix(config):
        order_by_config(config, items)
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
        config.stash[DESELECTED_KEY] = (
            f"prefixcache: {len(drop)} deselected: a replay runs only test_replay"
            if s.replay is not None
            else f"prefixcache: {len(drop)} deselected: test_replay, which runs only with "
            "--prefixcache-replay=PATH (a saved failing stream)"
        )


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    return [config.stash[DESELECTED_KEY]] if DESELECTED_KEY in config.stash else []


def _needs_engine(item: pytest.Item) -> bool:
    return any(f in getattr(item, "fixturenames", ()) for f in ENGINE_FIXTURES)


def pytest_runtest_setup(item: pytest.Item) -> None:
    slot = slot_of(item)
    worker = slot.worker
    if not _needs_engine(item):
        return
    if slot.report.engine_error:  # one error, shown by the first test that needed the engine
        pytest.skip("the engine could not be built (the error above)")  # printed once
    if worker is not None and worker.dead:
        pytest.skip(f"the engine is dead ({worker.dead}); remaining checks skipped")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    raised = call.excinfo.value if call.excinfo is not None else None
    if report.failed and report.when == "setup" and _needs_engine(item):
        error = slot_of(item).report.engine_error
        if error:  # its engine could not be built: one error, however many workers say so
            report.user_properties.append((ENGINE_ERROR, error))
    if report.failed:
        for exc in verification_failures(raised):
            if exc.stream:
                record(item, report, exc, flaky=exc is not raised and is_flaky(raised))
    if _is_suite(item) and report.skipped:
        record_skip(item, report)
    if _is_suite(item) and report.when == "call":
        xd.attach_progress(item.config, report)
    return report


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[START_KEY] = time.monotonic()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    xd.send_report(config)
    if xd.is_worker(config) or not settings_of(config).verify or config.option.collectonly:
        return
    rep = report_of(config)
    failed = config.pluginmanager.get_plugin("prefixcache-failed")
    if isinstance(failed, FailedTests):  # a test error, an isolation failure, a crashed worker
        reports = {name: slot.report for name, slot in slots_of(config).items()}
        failed.record_errors(rep, reports, config.stash.get(START_KEY, 0.0))
    if is_matrix(config):
        assemble(config)
    # A verification that ran no request, whose correctness checks could not all run, or
    # whose failure could not be confirmed, is not a pass (the terminal summary says why).
    if session.exitstatus == pytest.ExitCode.OK and rep.verdict in ("incomplete", "inconclusive"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    # an engine that could not be built (in any configuration) is not a verification failure
    if rep.engine_error and session.exitstatus in (0, 1):
        session.exitstatus = ENGINE_ERROR_EXIT
    _verdict_in_junit(config, rep)


def _verdict_in_junit(config: pytest.Config, rep: Report) -> None:
    """The verdict and the coverage table as properties of the JUnit test suite (--junitxml),
    from the report this process holds: with pytest-xdist, the controller's merged one. Runs
    before the junitxml plugin writes its file (this hook is tryfirst)."""
    from _pytest.junitxml import xml_key  # pytest's own; no public accessor for LogXML

    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    xml.add_global_property("prefixcache_verdict", rep.verdict)
    if rep.run_file:  # what replays the failures (docs/release-gate.md)
        xml.add_global_property("prefixcache_run_file", rep.run_file)
    for row in rep.configs:
        xml.add_global_property(f"prefixcache_verdict[{row['name']}]", row["verdict"])
    for check, row in rep.coverage.items():
        applied, total = row.get("applied", 0), sum(row.values())
        xml.add_global_property(f"prefixcache_coverage: {check}", f"{applied}/{total}")


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    s = settings_of(config)
    rep = report_of(config)
    if xd.is_worker(config) or not (s.verify or rep.requests or rep.failures):
        return
    terminalreporter.write_sep("=", "prefixcache")
    for line in rep.lines():
        terminalreporter.write_line(line)
    if s.report is not None:
        path = s.report if s.report.is_absolute() else s.invocation_dir / s.report
        rep.write_json(path)
        terminalreporter.write_line(f"JSON report written to {path}")
    if s.html is not None:
        from .html.page import write_html  # the page's renderer, only when asked

        page = s.html if s.html.is_absolute() else s.invocation_dir / s.html
        write_html(rep, page, base_dir=page.parent)
        terminalreporter.write_line(f"HTML report written to {page}")
