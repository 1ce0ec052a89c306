"""Every option of the plugin, once: the pytest options (``pytest --help``), the
``prefixcache`` command's flags, the :class:`~.settings.Settings` fields they fill, the flags a
replay command repeats, and the option tables of the README and docs/release-gate.md
(``python -m pytest_prefixcache.session.option_table`` prints them; tests/test_option_table.py
fails when a document's table drifts from this one)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..output.streams import FAILURES_DIR
from ..verify.worker import DEFAULT_TIMEOUT
from . import targets, values

__all__ = ["OPTIONS", "Option", "by_name", "markdown_table", "replay_flags", "settings_values"]


@dataclass(frozen=True)
class Option:
    """One option: ``--prefixcache-NAME`` for pytest, ``--NAME`` for the ``prefixcache``
    command's subcommands in ``cli``.

    Attributes:
        name: the option without its prefix (``timeout``).
        help: one line for ``--help`` (pytest's and the command's).
        doc: the meaning in the documents' tables (Markdown); default: ``help``.
        type: the validator of its value (an ``argparse`` ``type=``); None: a switch.
        metavar: its value's name in usage lines.
        default: its value when not given.
        repeatable: given once per configuration (``action="append"``).
        cli: the ``prefixcache`` subcommands that take it (``verify``, ``replay``).
        setting: the :class:`Settings` field it fills as it is (None: resolved elsewhere).
        path: the setting is a :class:`~pathlib.Path`.
        replay: a replay command repeats it when it is not at its default.
        common: listed in the README's table of the options used most.
    """

    name: str
    help: str
    doc: str = ""
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    default: Any = None
    repeatable: bool = False
    cli: tuple[str, ...] = ()
    setting: str | None = None
    path: bool = False
    replay: bool = False
    common: bool = False

    @property
    def flag(self) -> str:
        return f"--prefixcache-{self.name}"

    @property
    def dest(self) -> str:
        return "prefixcache_" + self.name.replace("-", "_")

    @property
    def cli_flag(self) -> str:
        return f"--{self.name}"

    @property
    def usage(self) -> str:
        """``--prefixcache-NAME=METAVAR``, as the tables write it."""
        return self.flag + (f"={self.metavar}" if self.metavar else "")

    @property
    def meaning(self) -> str:
        return self.doc or self.help

    def argparse_kwargs(self) -> dict[str, Any]:
        """What pytest's ``addoption`` and the command's ``add_argument`` both take."""
        if self.type is None:
            return {"action": "store_true", "help": self.help}
        action = "append" if self.repeatable else "store"
        return {"type": self.type, "metavar": self.metavar, "help": self.help, "action": action}


BOTH = ("verify", "replay")

OPTIONS: tuple[Option, ...] = (
    Option("verify", "Add the built-in prefix-cache verification suite to the session",
           doc="add the built-in verification suite to the session", common=True),
    Option("engine", "Engine under test: an Engine instance or a zero-argument callable "
           f"returning one (default: ini prefixcache_engine, else {values.DEFAULT_ENGINE}); "
           "repeat it for several configurations (named NAME, else after ATTR)",
           doc=f"the engine under test (default `{values.DEFAULT_ENGINE}`); repeatable, one "
           "configuration each (named NAME, else after ATTR)",
           type=targets.named_engine, metavar="[NAME=]MODULE:ATTR", repeatable=True, cli=BOTH,
           common=True),
    Option("model", "Model every engine factory loads: a shipped fixture's name (tiny-qwen2-vl, "
           "tiny-llama, ...) or a model directory; exported as PREFIXCACHE_MODEL (default: ini "
           "prefixcache_model, else $PREFIXCACHE_MODEL, else each engine's own fixture)",
           doc="the model every engine factory loads: a shipped fixture (`tiny-qwen2-vl`, "
           "`tiny-qwen3.5-vl`, `tiny-gemma3`, `tiny-gemma4`, and the text-only `tiny-llama`, "
           "`tiny-qwen3.5`, `tiny-gemma3-text`, `tiny-gemma4-text`) or a model directory; "
           "named in the header, the reports and every replay command",
           type=values.model_dir, metavar="NAME|DIR", cli=BOTH, common=True),
    Option("server-cmd", "Verify an OpenAI-compatible server started from CMD ({port} is "
           "replaced by an ephemeral port on 127.0.0.1); more settings by PREFIXCACHE_* "
           "variables; repeatable, as --prefixcache-engine",
           doc="verify an OpenAI-compatible server started from CMD (`{port}` is replaced; "
           "more settings by `PREFIXCACHE_*` variables); repeatable",
           type=targets.named_server_cmd, metavar="[NAME=]CMD", repeatable=True, cli=BOTH,
           common=True),
    Option("server-body", "With --prefixcache-server-cmd: a JSON object of fields added to "
           "every request body (e.g. '{\"return_tokens_as_token_ids\": true}'; "
           "PREFIXCACHE_EXTRA_BODY)",
           doc="with `--prefixcache-server-cmd`: a JSON object of fields added to every request "
           "body (`PREFIXCACHE_EXTRA_BODY`)",
           type=values.server_body, metavar="JSON", cli=BOTH, setting="server_body"),
    Option("matrix", "Verify every engine configuration of a matrix file (TOML: [[config]] "
           "tables with name, engine or server_cmd, and a product over [config.flags])",
           doc="verify every configuration of a TOML matrix file",
           metavar="FILE", type=str, cli=BOTH),
    Option("config", "Run only this configuration (repeatable; a base name selects all its "
           "flag combinations)",
           doc="with `--prefixcache-matrix`: only the named configurations (repeatable; a base "
           "name selects all its flag combinations)",
           metavar="NAME", type=str, repeatable=True, cli=BOTH),
    Option("examples", f"Examples per property (default: {values.DEFAULT_EXAMPLES}; the "
           f"state machine runs half as many, {values.STATEFUL_STEPS} steps each)",
           doc=f"Hypothesis examples per property (default {values.DEFAULT_EXAMPLES}; the "
           "state machine runs half as many)",
           type=values.positive_int, metavar="N", default=values.DEFAULT_EXAMPLES, cli=("verify",),
           setting="examples", common=True),
    Option("seed", "Seed for the generated streams (default: random, printed in the header)",
           doc="seed of the generated streams; the header prints the flag that reproduces a run",
           type=values.seed, metavar="S", cli=("verify",), common=True),
    Option("report", "Write a JSON report: requests, hits, reuse vs oracle, worst difference, "
           "failures",
           doc="JSON report: requests, hits, reuse vs oracle, worst difference, failures",
           metavar="PATH", type=str, setting="report", path=True, common=True),
    Option("html", "Write the self-contained HTML report (verdict, coverage, failures with "
           "their replay lines) and print its path",
           doc="self-contained HTML report: verdict, coverage, failures and their replay lines",
           metavar="PATH", type=str, setting="html", path=True, common=True),
    Option("timeout", "Fail an engine call that takes longer, and treat the engine as dead "
           f"(default: {DEFAULT_TIMEOUT:g})",
           doc="an engine call that takes longer fails, and the engine is treated as dead "
           f"(default {DEFAULT_TIMEOUT:g})",
           type=values.positive_float, metavar="SECONDS", default=DEFAULT_TIMEOUT, cli=BOTH,
           setting="timeout", replay=True, common=True),
    Option("atol", "Absolute tolerance for cached vs uncached logits (default: 0, exact, or "
           "the engine's own atol)",
           doc="absolute tolerance for cached vs uncached logits (default: exact, or the "
           "engine's own `atol` when it declares one; the report names which)",
           type=values.non_negative_float, metavar="X", default=values.DEFAULT_TOLERANCE, cli=BOTH,
           setting="atol", replay=True, common=True),
    Option("rtol", "Relative tolerance for cached vs uncached logits (default: 0, exact)",
           doc="relative tolerance for cached vs uncached logits (default: exact)",
           type=values.non_negative_float, metavar="X", default=values.DEFAULT_TOLERANCE, cli=BOTH,
           setting="rtol", replay=True),
    Option("kl", "Use the top-k/KL rule instead: estimated KL per step at most X and top tokens "
           "agreeing (for GPU engines and top_logprobs-only engines)",
           doc="top-k/KL rule for GPU engines and engines that only return top logprobs",
           type=values.non_negative_float, metavar="X", cli=BOTH, setting="kl", replay=True),
    Option("min-efficiency", "Fail when a stream reuses less than F of what the oracle says "
           "was reusable",
           doc="fail when reuse falls below F of what the reference says was reusable",
           type=values.fraction, metavar="F", cli=("verify",), setting="min_efficiency",
           replay=True),
    Option("min-speedup", "Fail when a stream's cache hits do not reach their first token X "
           "times faster than their cold runs (whole calls when the engine reports no time to "
           "first token)",
           doc="fail when requests served from the cache do not reach their first token X times "
           "faster than cold: the prefill part, what reuse saves (whole calls when the engine "
           "reports no time to first token; opt-in; timing is noisy)",
           type=values.positive_ratio, metavar="X", setting="min_speedup", replay=True),
    Option("strict-render", "Fail on render-hygiene findings (a next turn that re-renders the "
           "history, requests that differ only in volatile bytes); by default they are reported",
           doc="fail on render-hygiene findings (a next turn that re-renders the history, "
           "requests that differ only in volatile bytes); by default they are reported",
           cli=BOTH, setting="strict_render", replay=True),
    Option("restarts", "Add the restart streams: the engine (its declared restart(changed)) "
           "is restarted between requests, with the same configuration or one thing changed; "
           "restored prefixes must equal cold, and nothing from before a changed restart may be "
           "reused (stale identity). The reference engine gets a disk tier for it (implies "
           "--prefixcache-verify)",
           doc="add streams that restart the engine between requests (same configuration, or "
           "one thing changed: nothing from before may be reused)",
           cli=BOTH, setting="restarts", replay=True),
    Option("allow-partial", "Pass even when some correctness check could not run on every "
           "request (the verdict says PASS (partial) and names them); without it such a run "
           "exits 1",
           doc="pass even when a correctness check could not run on every request; the verdict "
           "says `PASS (partial: ...)` and names them",
           cli=BOTH, setting="allow_partial", common=True),
    Option("replay", "Replay exactly the stream saved at PATH (a stream.json or its directory)",
           doc="replay exactly a saved failing stream", metavar="PATH", type=str, common=True),
    Option("isolation", "Add the timing side-channel test: time to first token must not reveal "
           "another namespace's cached prefix (KS test; implies --prefixcache-verify)",
           doc="add the cross-tenant timing side-channel audit (implies `--prefixcache-verify`)",
           cli=("verify",), common=True),
    Option("shards", "Split the generated tests into N shards, each with its own seed derived "
           "from --prefixcache-seed and examples/N examples (default: one per pytest-xdist "
           "worker)",
           doc="split the generated tests into N shards with seeds derived from the session "
           "seed (default: one per pytest-xdist worker)",
           type=values.positive_int, metavar="N"),
    Option("parallel-streams", "Run N generated streams at once, each in its own namespace, "
           "when the engine declares concurrent service (max_concurrency above 1) and "
           "namespaces; the same checks per stream (default: 1, one at a time)",
           doc="run N generated streams at once, each in its own namespace, on an engine that "
           "declares `max_concurrency` above 1 and namespaces; every check per stream as "
           "sequentially, failures replay in parallel (default 1: one at a time)",
           type=values.positive_int, metavar="N", default=values.DEFAULT_PARALLEL_STREAMS,
           cli=("verify",), setting="parallel_streams"),
    Option("database", "Hypothesis example database, replayed first: a directory, a "
           "redis://HOST:PORT/DB URL shared by many machines, or none (default: "
           f"$PREFIXCACHE_DATABASE, else {values.DEFAULT_DATABASE})",
           doc="Hypothesis example database, replayed first (default `$PREFIXCACHE_DATABASE`, "
           f"else `{values.DEFAULT_DATABASE}`; `redis://HOST:PORT/DB` to share failures "
           "between machines)",
           type=values.database_spec, metavar="DIR|URL|none", cli=("verify",)),
    Option("budget", "Keep generating new rounds of examples (fresh seeds) until SECONDS of "
           "wall time are spent; a round in progress finishes (default: one round)",
           doc="keep fuzzing with fresh seeds until SECONDS of wall time are spent (a round in "
           "progress finishes)",
           type=values.positive_float, metavar="SECONDS", cli=("verify",), setting="budget"),
    Option("shrink-budget", "Examples a failing property may still run on the engine after its "
           "first failure (shrinking it, looking for other bugs), as a share X of its own "
           f"examples; past it only the failures found are replayed (default: "
           f"{values.DEFAULT_SHRINK_BUDGET:g}; none: Hypothesis's own limits)",
           doc="examples a failing property may still run after its first failure, as a share "
           f"of its examples (default {values.DEFAULT_SHRINK_BUDGET:g}: a failing property runs at "
           "most twice a passing one's; `none`: Hypothesis's own limits); every failure found "
           "is still reported, shrunk as far as the budget went",
           type=values.shrink_budget, metavar="X|none", default=values.DEFAULT_SHRINK_BUDGET,
           cli=("verify",), setting="shrink_budget"),
    Option("progress", "Print requests done, hits and failures so far every SECONDS "
           f"(0: never; default: {values.DEFAULT_PROGRESS:g})",
           doc="a progress line (requests, hits, failed tests, failing examples while "
           f"shrinking) every SECONDS (default {values.DEFAULT_PROGRESS:g}, 0 off)",
           type=values.non_negative_float, metavar="SECONDS", default=values.DEFAULT_PROGRESS,
           setting="progress"),
    Option("failures-dir", f"Save failing streams (stream.json and images) under DIR "
           f"(default: {FAILURES_DIR})",
           doc=f"where failing streams are saved (default `{FAILURES_DIR}`)",
           metavar="DIR", type=str, setting="failures_to", path=True),
)  # fmt: skip


def by_name(name: str) -> Option:
    """The option called ``name`` (without its prefix)."""
    for o in OPTIONS:
        if o.name == name:
            return o
    raise KeyError(name)


def add_to_pytest(add: Callable[..., Any]) -> None:
    """Register every option with pytest's ``group.addoption``."""
    for o in OPTIONS:
        add(o.flag, default=False if o.type is None else o.default, **o.argparse_kwargs())


def cli_options(command: str) -> tuple[Option, ...]:
    """The options the ``prefixcache`` subcommand ``command`` takes."""
    return tuple(o for o in OPTIONS if command in o.cli)


def add_to_cli(p: argparse._ActionsContainer, options: Sequence[Option]) -> None:
    """Register ``options`` with a ``prefixcache`` subcommand's parser, without their prefix."""
    for o in options:
        p.add_argument(o.cli_flag, **o.argparse_kwargs())


def cli_to_pytest(values: argparse.Namespace, options: Sequence[Option]) -> list[str]:
    """The pytest flags for the ``prefixcache`` command's parsed ``values`` of ``options``."""
    out: list[str] = []
    for o in options:
        value = getattr(values, o.name.replace("-", "_"))
        if o.type is None:
            out += [o.flag] if value else []
        elif isinstance(value, list):
            out += [f"{o.flag}={v}" for v in value]
        elif value is not None:
            out.append(f"{o.flag}={value}")
    return out


def settings_values(getoption: Callable[[str], Any]) -> dict[str, Any]:
    """The :class:`Settings` fields the options fill as they are (``setting``)."""
    out: dict[str, Any] = {}
    for o in OPTIONS:
        if o.setting is None:
            continue
        value = getoption(o.dest)
        if o.type is None:
            value = bool(value)
        elif o.path and value is not None:
            value = Path(value)
        out[o.setting] = value
    return out


def replay_flags(s: object) -> list[str]:
    """The flags (``replay``) a replay command repeats: those not at their default. ``s`` is a
    :class:`~.settings.Settings` (read by field name, so this table imports nothing of it:
    settings.py imports this module)."""
    out: list[str] = []
    # the timeout last: a replay names the engine's behaviour first, then how long to wait
    for o in sorted(OPTIONS, key=lambda o: o.name == "timeout"):
        if not o.replay or o.setting is None:
            continue
        value = getattr(s, o.setting)
        if value == o.default or (o.type is None and not value):
            continue
        out.append(o.flag if o.type is None else f"{o.flag}={value:g}")
    return out


def markdown_table(options: Sequence[Option] = OPTIONS, command: bool = True) -> str:
    """The documents' option table: the pytest option, the ``prefixcache`` command's flag and
    the subcommands that take it (``command``), and its meaning."""
    head = ["option", "`prefixcache`", "meaning"] if command else ["option", "meaning"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for o in options:
        cells = [f"`{_cell(o.usage)}`"]
        if command:
            cells.append(f"`{o.cli_flag}` ({', '.join(o.cli)})" if o.cli else "")
        rows.append("| " + " | ".join([*cells, _cell(o.meaning)]) + " |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def common_table() -> str:
    """The README's table: the options used most."""
    return markdown_table([o for o in OPTIONS if o.common], command=False)


if __name__ == "__main__":  # print the tables the documents hold
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    print(common_table() if which == "common" else markdown_table())
