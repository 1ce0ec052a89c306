"""The ``prefixcache`` command: gate a release on the verification suite.

``prefixcache verify`` runs the suite against an engine and writes ``report.json``,
``junit.xml`` and a self-contained ``report.html`` into ``--out``; ``prefixcache replay PATH``
runs one saved failing stream (``--run RUN.json``: with the settings of the run that saved it,
its flags and environment, so that a clean shell reproduces the failure; ``verify --run``
takes the same file, written by hand, as a run's whole configuration);
``prefixcache report REPORT.json`` renders the HTML page.

Exit codes: 0 the engine passed, 1 a verification check failed, 2 usage error or the engine
could not be loaded (the report names why). With several configurations (repeated
``--engine``/``--server-cmd``, ``--matrix FILE``): the worst configuration's, and 2 when any
configuration's engine could not be built (after every configuration ran).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .errors import PrefixCacheError
from .output.report import Report
from .output.run_file import RunFile, is_recorded, load_run_file, package_version
from .session import option_table, settings, sources

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _workers(value: str) -> str:
    if value != "auto":
        settings.positive_int(value)
    return value


def _engine_args(p: argparse.ArgumentParser, command: str) -> None:
    """The plugin's options this subcommand takes (:mod:`.session.option_table`), and --out."""
    option_table.add_to_cli(
        p.add_argument_group("options (default engine: the embedded reference engine)"),
        option_table.cli_options(command),
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("prefixcache-report"),
        metavar="DIR",
        help="where report.json, junit.xml, report.html and failures/ go "
        "(default: prefixcache-report)",
    )
    p.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS",
                   help="more pytest arguments, after --")  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prefixcache",
        description="Verify an inference engine's prefix cache (pytest-prefixcache).",
        epilog="exit codes: 0 passed, 1 verification failed or incomplete (a correctness "
        "check could not run), 2 usage or engine-load error",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    v = sub.add_parser("verify", help="run the verification suite and write the reports")
    v.add_argument("--run", type=Path, metavar="RUN.json",
                   help="a run file (written by a run, or by hand: format, flags, "
                   "environment): verify with its flags and environment, in its "
                   "directory")  # fmt: skip
    _engine_args(v, "verify")
    v.add_argument("--workers", type=_workers, metavar="N|auto",
                   help="split across pytest-xdist workers, one engine each")  # fmt: skip
    r = sub.add_parser("replay", help="run one saved failing stream (stream.json or its dir)")
    r.add_argument("path", type=Path, metavar="PATH")
    r.add_argument("--run", type=Path, metavar="RUN.json",
                   help="the run file saved beside the stream: replay with that run's flags "
                   "and environment (PREFIXCACHE_* and the engines' variables), in its "
                   "directory; pytest options after -- still override")  # fmt: skip
    _engine_args(r, "replay")
    h = sub.add_parser("report", help="render a JSON report as a self-contained HTML page")
    h.add_argument("report", type=Path, metavar="REPORT.json")
    h.add_argument("-o", "--output", type=Path, metavar="OUT.html",
                   help="default: next to the JSON file, with .html")  # fmt: skip
    return p


#: The options a run file's flags name, which ``replay --run`` refuses beside it.
ENGINE_OPTIONS = ("engine", "server-cmd", "server-body", "matrix", "config", "model")


def _pytest_args(
    a: argparse.Namespace, out: Path, ini: Path, run: RunFile | None = None
) -> list[str]:
    # a gate reads none of the project's pytest configuration: no ini, no conftest.py; and
    # leaves nothing in the temp directory: pytest's basetemp (which pytest-xdist creates for
    # --workers) goes next to the ini, in the directory _run removes
    args = ["-c", str(ini), "--rootdir", str(Path.cwd()), "-p", "no:cacheprovider", "--noconftest"]
    args += ["--basetemp", str(ini.parent / "basetemp")]
    args += ["--pyargs", "pytest_prefixcache.suite", "--prefixcache-verify"]
    args += [f"--prefixcache-report={out / 'report.json'}", f"--junitxml={out / 'junit.xml'}"]
    args.append(f"--prefixcache-failures-dir={out / 'failures'}")
    args += option_table.cli_to_pytest(a, option_table.cli_options(a.command))
    args += list(run.flags) if run is not None else []  # after the command's defaults
    if a.command == "replay":
        args.append(f"--prefixcache-replay={a.path.resolve()}")
    elif a.workers:
        args += ["-n", a.workers]
    return args + list(a.pytest_args)


def _usage(message: str) -> int:
    print(f"prefixcache: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _write_html(report: Report, path: Path, base_dir: Path) -> None:
    from .html import write_html

    written = write_html(report, path, base_dir=base_dir)
    print(f"prefixcache: HTML report written to {written}")


def _render(report_path: Path, output: Path | None) -> int:
    try:
        report = Report.read_json(report_path)
    except ValueError as exc:
        return _usage(str(exc))
    _write_html(report, output or report_path.with_suffix(".html"), report_path.parent)
    return EXIT_OK


def _run_file(a: argparse.Namespace) -> RunFile | None:
    """The run file ``--run`` names (None without one); PrefixCacheError when it is missing or
    malformed, or when an option beside it names the engine too."""
    if getattr(a, "run", None) is None:
        return None
    run = load_run_file(a.run)
    given = [f"--{o}" for o in ENGINE_OPTIONS if getattr(a, o.replace("-", "_"), None)]
    if given:
        raise PrefixCacheError(
            f"--run {a.run} names the engine (its flags: {' '.join(run.flags)}); drop "
            f"{', '.join(given)}, or replay without --run"
        )
    return run


@contextmanager
def _applied(run: RunFile, source: Path) -> Iterator[None]:
    """The run's environment (its recorded variables set, the shell's others of the same
    kinds unset) and working directory, restored afterwards."""
    saved, cwd = dict(os.environ), Path.cwd()
    keep = {*run.environment, *run.withheld}  # withheld: the shell's own (credentials)
    dropped = sorted(k for k in os.environ if is_recorded(k) and k not in keep)
    for k in dropped:
        del os.environ[k]
    os.environ.update(run.environment)
    print(f"prefixcache: with the settings of the run file {source}: "
          f"{shlex.join(run.flags)}; environment: {', '.join(run.environment) or 'none'}"
          + (f"; unset from this shell: {', '.join(dropped)}" if dropped else ""))  # fmt: skip
    missing = [k for k in run.withheld if k not in os.environ]
    if missing:
        print(f"prefixcache: note: the run had {', '.join(missing)}, which a run file does not "
              "keep (it may hold a credential), and this shell does not set it")  # fmt: skip
    if run.python and Path(run.python) != Path(sys.executable):
        print(f"prefixcache: note: the run used the interpreter {run.python}, this is "
              f"{sys.executable}")  # fmt: skip
    if run.version and run.version != package_version():
        print(f"prefixcache: note: the run used pytest-prefixcache {run.version}, this is "
              f"{package_version()}")  # fmt: skip
    directory = Path(run.directory) if run.directory else cwd
    if directory.is_dir():
        os.chdir(directory)
    else:
        print(f"prefixcache: note: the run's directory {directory} does not exist here; "
              f"relative paths in its flags resolve against {cwd}")  # fmt: skip
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


def _run(a: argparse.Namespace) -> int:
    if a.command == "replay" and not a.path.exists():
        return _usage(f"{a.path}: no such file or directory")
    try:
        run = _run_file(a)
    except PrefixCacheError as exc:
        return _usage(str(exc))
    if run is None:
        return _verify(a, None)
    if a.command == "replay":
        a.path = a.path.resolve()  # against this shell's directory
    a.out = a.out.resolve()
    with _applied(run, a.run):
        return _verify(a, run)


def _verify(a: argparse.Namespace, run: RunFile | None) -> int:
    import pytest

    try:
        names = (a.engine or [], a.server_cmd or [], a.matrix, a.config or [])
        if run is None and sources.is_matrix_run(*names):
            sources.resolve_targets(
                a.engine or [], a.server_cmd or [], a.server_body, a.matrix, a.config or [],
                Path.cwd(),
            )  # fmt: skip
    except sources.SourceError as exc:  # the plugin's words, with this command's flags
        return _usage(str(exc).replace("--prefixcache-", "--"))
    if getattr(a, "workers", None) and importlib.util.find_spec("xdist") is None:
        return _usage("--workers needs pytest-xdist (pip install 'pytest-prefixcache[xdist]')")
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").unlink(missing_ok=True)  # a stale report must not pass for this run
    with tempfile.TemporaryDirectory() as tmp:
        ini = Path(tmp) / "pytest.ini"  # the project's own pytest config does not apply
        ini.write_text("[pytest]\n", encoding="utf-8")
        rc = int(pytest.main(_pytest_args(a, out, ini, run)))
    report_json = out / "report.json"
    if not report_json.exists():
        return _usage(f"pytest exited {rc} before writing a report (see its output above)")
    try:
        report = Report.read_json(report_json)
    except ValueError as exc:
        return _usage(str(exc))
    _write_html(report, out / "report.html", out)
    if report.engine_error:
        print(f"prefixcache: the engine could not be loaded: {report.engine_error}",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    if rc == pytest.ExitCode.OK:
        return EXIT_OK
    if rc == pytest.ExitCode.TESTS_FAILED:
        return EXIT_FAILED
    return _usage(f"pytest exited {rc} ({pytest.ExitCode(rc).name})")


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.command == "report":
        return _render(a.report, a.output)
    return _run(a)


if __name__ == "__main__":
    sys.exit(main())
