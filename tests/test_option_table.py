"""One option table (session/option_table.py) makes the pytest options, the ``prefixcache``
command's flags, the settings they fill, the replay command's flags and the documents' tables;
the documents' tables must be what the table prints."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from pytest_prefixcache import cli
from pytest_prefixcache.session import option_table as ot
from pytest_prefixcache.session.settings import Settings
from pytest_prefixcache.session.stash import SETTINGS_KEY

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = {"common": ROOT / "README.md", "all": ROOT / "docs" / "release-gate.md"}


def document_table(text: str, tag: str) -> str | None:
    """The table between ``<!-- option-table: TAG ... -->`` and ``<!-- /option-table -->``."""
    m = re.search(rf"<!-- option-table: {tag} [^\n]*-->\n(.*?)\n<!-- /option-table -->", text, re.S)
    return None if m is None else m.group(1)


def drift(text: str, tag: str) -> str:
    """Why a document's table is not the generated one ('' when it is)."""
    table = document_table(text, tag)
    want = ot.common_table() if tag == "common" else ot.markdown_table()
    if table is None:
        return f"no <!-- option-table: {tag} --> block"
    if table == want:
        return ""
    old, new = set(table.splitlines()), set(want.splitlines())
    return f"rows not in the table: {sorted(old - new)}; rows missing: {sorted(new - old)}"


@pytest.mark.parametrize("tag", sorted(DOCUMENTS))
def test_the_documents_tables_are_the_generated_ones(tag: str) -> None:
    assert drift(DOCUMENTS[tag].read_text(encoding="utf-8"), tag) == "", (
        f"{DOCUMENTS[tag].name}: regenerate it with "
        f"python -m pytest_prefixcache.session.option_table {tag}"
    )


def test_a_drifted_table_is_found() -> None:
    """Negative control: a README whose table lost an option, or changed a default, drifts."""
    text = DOCUMENTS["common"].read_text(encoding="utf-8")
    lost = "\n".join(line for line in text.splitlines() if "--prefixcache-seed=S" not in line)
    assert "rows missing" in drift(lost, "common") and "--prefixcache-seed=S" in drift(
        lost, "common"
    )
    changed = text.replace("(default 60)", "(default 30)")
    assert "(default 30)" in drift(changed, "common")
    assert drift("no table here", "all") == "no <!-- option-table: all --> block"


def test_every_option_is_a_pytest_option_with_its_help(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig()
    for o in ot.OPTIONS:
        assert config.getoption(o.dest) == (False if o.type is None else o.default), o.name
    helptext = pytester.runpytest("--help").stdout.str()
    for o in ot.OPTIONS:
        assert o.flag in helptext, o.flag


def test_every_cli_option_reaches_pytest_under_its_prefixed_name(tmp_path: Path) -> None:
    argv = ["verify", "--engine", "m:e", "--timeout", "7", "--atol", "0.5", "--strict-render"]
    argv += ["--allow-partial", "--isolation", "--examples", "3", "--seed", "4"]
    a = cli._parser().parse_args(argv)
    args = cli._pytest_args(a, tmp_path, tmp_path / "pytest.ini")
    wanted = ["engine=m:e", "timeout=7.0", "atol=0.5", "strict-render", "allow-partial"]
    wanted += ["isolation", "examples=3", "seed=4"]
    for flag in (f"--prefixcache-{w}" for w in wanted):
        assert flag in args, (flag, args)
    with pytest.raises(SystemExit):  # replay does not take verify's options
        cli._parser().parse_args(["replay", "x.json", "--examples", "3"])
    for command in ("verify", "replay"):
        sub = cli._parser().parse_args([command, "p"] if command == "replay" else [command])
        for o in ot.cli_options(command):
            assert hasattr(sub, o.name.replace("-", "_")), (command, o.name)


def test_options_fill_the_settings_and_the_replay_repeats_what_is_not_default(
    pytester: pytest.Pytester,
) -> None:
    given = ["rtol=0.25", "strict-render", "failures-dir=out", "budget=9"]
    config = pytester.parseconfigure(*(f"--prefixcache-{g}" for g in given))
    s: Settings = config.stash[SETTINGS_KEY]
    assert (s.rtol, s.strict_render, s.failures_to, s.budget) == (0.25, True, Path("out"), 9.0)
    assert ot.replay_flags(s) == ["--prefixcache-rtol=0.25", "--prefixcache-strict-render"]
    assert ot.replay_flags(Settings()) == []
    fields = set(Settings.__dataclass_fields__)
    assert all(o.setting in fields for o in ot.OPTIONS if o.setting)


def default_drift(options: tuple[ot.Option, ...] = ot.OPTIONS) -> list[str]:
    """Options whose default is not the default of the :class:`Settings` field they fill (the
    table reads its defaults from ``session.values``, not from ``Settings``)."""
    made = Settings()
    return [
        f"{o.name}: {o.default!r} != Settings().{o.setting} {getattr(made, o.setting)!r}"
        for o in options
        if o.setting and o.default is not None and o.default != getattr(made, o.setting)
    ]


def test_every_default_is_the_settings_default() -> None:
    assert {"examples", "timeout", "atol", "progress", "parallel-streams"} <= {
        o.name for o in ot.OPTIONS if o.setting and o.default is not None
    }
    assert default_drift() == []


def test_a_default_that_drifts_from_the_settings_is_found() -> None:
    """Negative control: the progress option with a default Settings does not have."""
    drifted = dataclasses.replace(ot.by_name("progress"), default=5.0)
    assert default_drift((drifted,)) == ["progress: 5.0 != Settings().progress 30.0"]


def test_names_are_unique_and_looked_up() -> None:
    names = [o.name for o in ot.OPTIONS]
    assert len(names) == len(set(names))
    assert ot.by_name("timeout").flag == "--prefixcache-timeout"
    with pytest.raises(KeyError):
        ot.by_name("nope")
