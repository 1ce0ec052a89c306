"""What the engine scripts' findings modules share (engines/{seed,llama,vllm,omlx}/findings.py,
engines/llama/matrix_findings.py): the targeted checks' outcomes from JUnit XML, a report's row,
a matrix file's combinations, the tap log's figures, the table's cells and the saved
counterexamples. Their command line is :mod:`.command_line`'s."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_prefixcache.session.targets import Target


def junit_outcomes(path: Path, expected: Callable[[str], bool]) -> dict[str, str]:
    """test name -> what happened, from JUnit XML of a ``--runxfail`` run: ``passed``,
    ``skipped``, ``xpassed`` (passed although ``expected(name)`` says it fails),
    ``xfailed: MESSAGE`` (failed as expected) or ``failed: MESSAGE`` (not expected).
    The engine scripts' findings modules (llama_findings, vllm_findings) use it too."""
    if not path.is_file():
        return {}
    out: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        kinds = {child.tag: child for child in case}
        bad = kinds.get("failure", kinds.get("error"))
        if bad is not None:
            message = " ".join((bad.get("message") or "").split())[:240]
            out[name] = f"{'xfailed' if expected(name) else 'failed'}: {message}"
        elif "skipped" in kinds:
            out[name] = "skipped"
        else:
            out[name] = "xpassed" if expected(name) else "passed"
    return out


def row(
    directory: Path, engine: str, version: str, mode: str, outcomes: dict[str, str]
) -> dict[str, Any]:
    """A mode's row from its directory's suite.json and tap.jsonl, with the targeted checks'
    ``outcomes``."""
    suite_path = directory / "suite.json"
    suite = json.loads(suite_path.read_text()) if suite_path.is_file() else {}
    return suite_row(suite, directory, engine, version, mode, outcomes)


def matrix_targets(matrix: Path) -> dict[str, tuple[int, Target]]:
    """The combinations of the matrix file ``matrix`` by name, each with its place in it."""
    from pytest_prefixcache.session.matrix_file import read_matrix

    return {t.name: (i, t) for i, t in enumerate(read_matrix(matrix))}


def mode_checks(path: Path, module: str, env: str, mode: str, folder: Path) -> dict[str, str]:
    """``junit_outcomes`` against the strict xfails an engine script's test module (in
    ``folder``) declares for ``mode`` (``module.KNOWN``, keyed by (mode, test name)); ``env``
    names the mode to the module, which reads it at import."""
    os.environ.setdefault(env, mode)
    sys.path.insert(0, str(folder))
    known = importlib.import_module(module).KNOWN
    reasons = {name for (m, name) in known if m == mode}
    return junit_outcomes(path, lambda name: name in reasons)


def tap_figures(path: Path) -> dict[str, Any]:
    """Over the cached runs: prompt tokens, the reuse the API reported (None when it never
    reports one), the reuse the tap saw, and the requests where the two disagree."""
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    warm = [r for r in rows if r["use_cache"]]
    reports = any(r["api_cached_tokens"] is not None for r in warm)
    # an API that reports cached_tokens at all but omits it on some replies (rapid-mlx omits
    # prompt_tokens_details when nothing was reused) is read as reporting 0 there
    api = [r["api_cached_tokens"] or 0 for r in warm] if reports else []
    tap = [r["tap_reused_tokens"] or 0 for r in warm]
    return {
        "requests": len(warm),
        "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in warm),
        "api_reused": sum(api) if reports else None,
        "tap_reused": sum(tap),
        "disagreeing_requests": sum(a != t for a, t in zip(api, tap)),
        "api_over_tap": sum(max(0, a - t) for a, t in zip(api, tap)),
        "api_under_tap": sum(max(0, t - a) for a, t in zip(api, tap)),
        "cold_reused": sum(r["tap_reused_tokens"] or 0 for r in rows if not r["use_cache"]),
    }


def suite_row(
    suite: dict[str, Any],
    directory: Path,
    engine: str,
    version: str,
    mode: str,
    outcomes: dict[str, str],
    tap: Path | None = None,
) -> dict[str, Any]:
    """The row of one plugin report (a mode's, or one matrix configuration's) with the
    targeted checks' ``outcomes`` (:func:`junit_outcomes`) and the tap log ``tap`` (default
    ``directory/tap.jsonl``)."""
    failures = [
        {k: f.get(k) for k in ("check", "test", "summary", "stream_dir", "replay")}
        for f in suite.get("failures", [])
    ]
    return {
        "engine": engine,
        "version": version,
        "mode": mode,
        "suite_ran": bool(suite) and not suite.get("engine_error"),
        "engine_error": suite.get("engine_error"),
        "requests": suite.get("requests"),
        "streams": suite.get("streams"),
        "cache_hits": suite.get("cache_hits"),
        "reused_tokens": suite.get("reused_tokens"),
        "oracle_tokens": suite.get("oracle_tokens"),
        "efficiency": suite.get("efficiency"),
        "worst_diff": suite.get("worst_diff"),
        "claims_checked": suite.get("claims_checked"),
        "steps_aligned": suite.get("steps_aligned"),
        "no_steps": (suite.get("coverage") or {}).get("step alignment", {}).get("applied") is None,
        "failures_by_check": suite.get("failures_by_check", {}),
        "failures": failures,
        "tap": tap_figures(tap or directory / "tap.jsonl"),
        "checks": outcomes,
    }


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def counterexample_name(r: dict[str, Any], f: dict[str, Any], taken: set[str]) -> str:
    base = f"{r.get('config') or r['engine']}-{slug(r['mode'])}-{slug(f['check'])}"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name


def save(
    reports: Path,
    corpus: Path,
    pattern: str = "*/row.json",
    script: str = "engines/seed/run.sh",
) -> list[str]:
    """Copy every failure's stream.json + PNGs to CORPUS/<engine>-<mode>-<check>[-n]/ with a
    description naming the engine, version, mode, the ``script`` that found it and what went
    wrong, for the rows ``pattern`` names under ``reports``; returns the names."""
    saved: list[str] = []
    taken: set[str] = set()
    for path in sorted(reports.glob(pattern)):
        r = json.loads(path.read_text())
        by_dir: dict[str, str] = {}  # two tests can shrink to the same stream: save it once
        for f in r["failures"]:
            source = Path(f["stream_dir"] or "")
            if not (source / "stream.json").is_file():
                continue
            if f["stream_dir"] in by_dir:
                f["saved"] = by_dir[f["stream_dir"]]
                continue
            name = by_dir[f["stream_dir"]] = counterexample_name(r, f, taken)
            target = corpus / name
            kept = {}  # a hand-written "diagnosis" of an earlier save survives a new one
            if target.exists():
                old = json.loads((target / "stream.json").read_text())
                kept = {k: old[k] for k in ("diagnosis",) if k in old}
                shutil.rmtree(target)
            shutil.copytree(source, target)
            data = json.loads((target / "stream.json").read_text())
            flag = mode_flags(r["engine"], r["mode"], r.get("flags")).replace("`", "")
            summary = re.sub(r"http://127\.0\.0\.1:\d+", "", f["summary"])  # ephemeral port
            data["description"] = (
                f"{r['engine']} {r['version']}, {flag}, found by {script}: {summary}"
            )
            data.update(engine=r["engine"], version=r["version"], mode=r["mode"], check=f["check"])
            if r.get("config", r["engine"]) != r["engine"]:  # a -waves config of the engine
                data["config"] = r["config"]
            data.update(kept)
            (target / "stream.json").write_text(json.dumps(data, indent=1) + "\n")
            f["saved"] = name
            saved.append(name)
        path.write_text(json.dumps(r, indent=1) + "\n")
    return saved


def mode_flags(engine: str, mode: str, flags: str | None = None) -> str:
    """How a row's configuration reads in the table: its flags (a matrix row), else the
    mode's name."""
    if flags is not None:
        return f"`{flags}`" if flags else "no flags"
    return mode


def markdown(columns: Sequence[str], lines: Iterable[str]) -> str:
    """A Markdown table: the header of ``columns``, its rule, then ``lines`` (whole rows)."""
    head = [f"| {' | '.join(columns)} |", f"|{' --- |' * len(columns)}"]
    return "\n".join([*head, *lines])


def efficiency(r: dict[str, Any], *, missing: str = "n/a", thousands: bool = True) -> str:
    """A row's efficiency against the token oracle: the suite's figure as a percentage
    (``missing`` when it has none) and the tokens, reused of the oracle's."""
    eff = r["efficiency"]
    sep = "," if thousands else ""
    text = missing if eff is None else f"{100 * eff:.1f}%"
    return text + f" ({r['reused_tokens']:{sep}} of {r['oracle_tokens']:{sep}})"


def share(part: int | None, whole: int | None) -> str:
    """``part`` of ``whole`` as a percentage and the two figures (n/a without a whole)."""
    if not whole:
        return "n/a"
    return f"{100 * (part or 0) / whole:.1f}% ({part or 0:,} of {whole:,})"


def _prefill(t: dict[str, Any]) -> str:
    p = t["prompt_tokens"]
    real = p - t["tap_reused"]
    if t["api_reused"] is None:
        return f"not reported / {real} of {p}"
    text = f"{p - t['api_reused']} / {real} of {p}"
    if t["disagreeing_requests"]:
        text += f" ({t['disagreeing_requests']} of {t['requests']} replies disagree with the tap"
        text += f": {t['api_over_tap']} tokens claimed reused were prefilled)"
    return text


def _short(summary: str) -> str:
    text = summary.split(": ", 1)[-1]
    text = re.sub(r"http://127\.0\.0\.1:\d+", "", text)
    text = re.sub(r"run\(request \d+, use_cache=\w+\) raised EngineError: ", "", text)
    return text[:120].rstrip() + ("..." if len(text) > 120 else "")


def failure_entries(
    r: dict[str, Any], corpus_link: str, keep: Callable[[dict[str, Any]], bool]
) -> str:
    """A table cell of a row's failures that ``keep`` accepts: one entry per distinct finding
    (its check and short summary) with links to its saved counterexamples under
    ``corpus_link``, joined by ``<br>``; '' when none."""
    parts: dict[str, list[str]] = {}  # one entry per distinct finding, with its counterexamples
    for f in r["failures"]:
        if not keep(f):
            continue
        links = parts.setdefault(f"{f['check']}: {_short(f['summary'])}", [])
        if f.get("saved"):
            link = f"[{f['saved']}]({corpus_link}/{f['saved']}/stream.json)"
            if link not in links:
                links.append(link)
    out = [f"{k} ({', '.join(v)})" if v else k for k, v in parts.items()]
    return "<br>".join(x.replace("|", "\\|") for x in out)


def _failures(
    r: dict[str, Any], corpus_link: str, skip: Callable[[str], bool] = lambda check: False
) -> str:
    """The failures column: the suite's failures (but those ``skip`` names) and the targeted
    checks that did not pass."""
    text = failure_entries(r, corpus_link, lambda f: not skip(f["check"])) or "none"
    bad = {
        k: v
        for k, v in r["checks"].items()
        if v not in ("passed", "skipped") and not skip(k.split("[")[0])
    }
    if bad:
        text += "<br>targeted checks: " + "; ".join(
            f"`{k}` {v.split(':')[0]}" for k, v in sorted(bad.items())
        )
    return text
