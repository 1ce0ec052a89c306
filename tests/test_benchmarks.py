"""The benchmark workloads are deterministic and the side-by-side runner works (no timings)."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import workloads as wl


def fingerprint(loads: list[wl.Workload]) -> list[tuple[str, int, tuple[str, ...]]]:
    return [
        (
            w.name,
            len(w.requests),
            tuple(
                f"{m.role}:" + "|".join(p if isinstance(p, str) else p.digest for p in m.content)
                for r in w.requests
                for m in r.messages
            ),
        )
        for w in loads
    ]


def test_workloads_are_deterministic_and_seeded() -> None:
    for size in wl.SIZES:
        assert fingerprint(wl.workloads(size)) == fingerprint(wl.workloads(size))
    assert fingerprint(wl.workloads("tiny", seed=1)) != fingerprint(wl.workloads("tiny"))


def test_workload_shapes() -> None:
    loads = {w.name: w for w in wl.workloads("tiny")}
    assert list(loads) == ["agentic_loop", "multimodal_agent", "photo_extraction", "image_edit"]
    assert not loads["agentic_loop"].multimodal
    assert not any(r.images for r in loads["agentic_loop"].requests)
    # the conversations grow: each request starts with all of the previous one's messages
    for name in ("agentic_loop", "multimodal_agent"):
        reqs = loads[name].requests
        for a, b in itertools.pairwise(reqs):
            assert b.messages[: len(a.messages)] == a.messages
    # earlier screenshots are re-attached in later turns
    mm = loads["multimodal_agent"].requests[-1]
    per_message = [img.digest for m in mm.messages for img in m.images]
    assert len(per_message) > len(set(per_message))
    # photos: one shared system prompt, every photo unique, several sizes
    photos = loads["photo_extraction"].requests
    assert len({r.messages[0] for r in photos}) == 1
    assert len({r.images[0].digest for r in photos}) == len(photos)
    assert len({r.images[0].size for r in photos}) > 1
    # image edit: A-E grown turn by turn, then A-E again with only image 2 changed
    edit = loads["image_edit"].requests
    full, changed = edit[4].images, edit[5].images
    assert len(full) == len(changed) == 5
    assert [a == b for a, b in zip(full, changed)] == [True, False, True, True, True]
    assert full[1].size == changed[1].size


def test_unknown_size() -> None:
    with pytest.raises(ValueError, match="'huge' is not one of tiny, large"):
        wl.workloads("huge")


@pytest.mark.slow
def test_runner_on_two_tiny_requests(model: Any) -> None:
    import side_by_side as sbs

    from reference_engine import Engine

    edit = wl.workloads("tiny")[3]
    two = wl.Workload("edit2", edit.requests[:2], multimodal=True)
    rows = sbs.one_pass(Engine(model), two, reference=True)
    assert [r["prompt_tokens"] for r in rows] == [166, 278]
    assert rows[0]["cached_tokens"] == rows[0]["oracle_max"] == 0
    assert rows[1]["oracle_max"] == rows[1]["cached_tokens"] == 166
    assert rows[1]["oracle_block_max"] == 160 and rows[1]["limits_reuse_agrees"]
    assert all(r["resident_bytes"] > 0 for r in rows)
    assert all(0 < r["limit_embed_s"] <= r["limit_s"] for r in rows)
    s = sbs.summary(rows)
    assert s["vs_oracle"] == 1.0
    assert {"warm_over_suffix", "warm_over_limit", "warm_slower_than_cold"} <= set(s)


def test_engines_are_interleaved_request_by_request() -> None:
    """Each request goes to every engine before the next one, the first engine rotating per
    request and per pass, so that a slow spell on the machine falls on all of them."""
    import side_by_side as sbs

    from pytest_prefixcache import Outcome

    calls: list[str] = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def reset(self) -> None:
            calls.append(f"{self.name} reset")

        def run(self, request: Any, *, use_cache: bool) -> Outcome:
            i = loop.requests.index(request)
            calls.append(f"{self.name}{i}{'w' if use_cache else 'c'}")
            return Outcome(logits=None, prompt_tokens=3, cached_tokens=0, token_ids=(1, 2, 3))

    loop = wl.workloads("tiny")[0]
    loop = wl.Workload("loop3", loop.requests[:3], multimodal=False)
    engines = {n: (Recorder(n), False) for n in "AB"}
    rows = sbs.interleaved_pass(engines, loop, turn=1)
    runs = "B0c B0w A0c A0w A1c A1w B1c B1w B2c B2w A2c A2w".split()
    assert calls == ["A reset", "B reset", *runs]
    assert [len(r) for r in rows.values()] == [3, 3]
    assert all(r["warm_cpu_s"] >= 0 and r["cold_cpu_s"] >= 0 for r in rows["A"])


def test_no_reuse_markdown_reads_the_committed_results(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import no_reuse

    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    paths = [str(results / f"no_reuse_{tag}.json") for tag in ("tiny", "tiny_before")]
    assert no_reuse.main(["--markdown", *paths]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 + 2 * 4  # header, rule, four workloads per file
    assert table[2].startswith("| tiny | current | agentic_loop | 2,969 |")
    assert table[6].startswith("| tiny | b9df58e (before) | agentic_loop |")
    with pytest.raises(SystemExit):
        no_reuse.main(["--markdown", str(tmp_path / "missing.json")])
    assert "no such file: " + str(tmp_path / "missing.json") in capsys.readouterr().err


def test_verify_cost_markdown_is_the_table_in_docs_benchmarks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import verify_throughput

    root = Path(__file__).resolve().parent.parent
    results = root / "benchmarks" / "results" / "verify_cost.json"
    assert verify_throughput.main(["--markdown", str(results)]) == 0
    table = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("|")]
    rounds = json.loads(results.read_text())["rounds"]
    assert len(table) == 2 + 3 * rounds  # header, rule, the three paths in every round
    doc = (root / "docs" / "benchmarks.md").read_text()
    assert all(line in doc for line in table)  # docs/benchmarks.md shows what the JSON says
    bad = tmp_path / "audit.json"
    bad.write_text('{"seed": 1}')
    for path, says in [(tmp_path / "missing.json", "cannot read it"), (bad, "not the JSON")]:
        with pytest.raises(SystemExit) as info:
            verify_throughput.main(["--markdown", str(path)])
        assert info.value.code == 2 and says in capsys.readouterr().err


def test_engine_clock_reads_the_engine_metric_of_server_timing() -> None:
    pytest.importorskip("mlx.core")
    import engine_clock

    assert engine_clock._server_timing("engine;dur=1500.000") == 1.5
    assert engine_clock._server_timing("db;dur=3, engine;desc=x;dur=250") == 0.25
    assert engine_clock._server_timing("db;dur=3") is None  # another metric: not the engine
    assert engine_clock._server_timing("") is None


def test_family_workload_shapes() -> None:
    loads = {w.name: w for w in wl.family_workloads()}
    assert list(loads) == ["growing_chat", "shared_system", "replaced_image", "swapped_images"]
    assert fingerprint(list(loads.values())) == fingerprint(wl.family_workloads())
    assert fingerprint(wl.family_workloads(seed=1)) != fingerprint(list(loads.values()))
    assert [w.multimodal for w in loads.values()] == [False, False, True, True]
    chat = loads["growing_chat"].requests  # the history plus one user turn, each time
    for a, b in itertools.pairwise(chat):
        assert b.messages[: len(a.messages)] == a.messages
        assert [m.role for m in b.messages[len(a.messages) :]] == ["assistant", "user"]
    shared = loads["shared_system"].requests  # one system prompt, a new user message each
    assert len({r.messages[0] for r in shared}) == 1
    assert len({r.messages[1] for r in shared}) == len(shared)
    grown, replaced = loads["replaced_image"].requests[-2:]  # only the second image differs
    assert [a == b for a, b in zip(grown.images, replaced.images)] == [True, False, True]
    assert grown.images[1].size == replaced.images[1].size
    first, swapped = loads["swapped_images"].requests[:2]
    assert swapped.images == first.images[::-1] and first.images[0] != first.images[1]


@pytest.mark.slow
def test_families_side_by_side_on_two_requests(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The script on its smallest setting: the reference engine, two requests of one workload
    on the hybrid fixture; the JSON and the Markdown table have their shape (no timings)."""
    pytest.importorskip("mlx.core")
    import families_side_by_side as fam

    argv = ["--family", "hybrid", "--engine", "reference", "--workload", "growing_chat"]
    argv += ["--requests", "2", "--out", str(tmp_path), "--markdown"]
    assert fam.main(argv) == 0
    out = capsys.readouterr().out
    figures = json.loads((tmp_path / "families_side_by_side.json").read_text())
    assert figures["command"] == "python benchmarks/families_side_by_side.py " + " ".join(argv)
    assert figures["command"] in out
    hybrid = figures["families"]["hybrid"]
    assert hybrid["fixtures"] == {"vlm": "tiny-qwen3.5-vl", "text": "tiny-qwen3.5"}
    result = hybrid["workloads"]["growing_chat"]["reference"]
    rows, s = result["requests"], result["summary"]
    assert len(rows) == 2 and all(r["prompt_tokens"] > 32 for r in rows)  # the window wraps
    assert rows[0]["cached_tokens"] == rows[0]["oracle_max"] == 0
    assert rows[1]["cached_tokens"] == rows[1]["oracle_max"] == rows[0]["prompt_tokens"]
    assert s["vs_oracle"] == 1.0 and s["max_abs_diff"] == 0.0  # bit-exact against cold
    assert {"cold_s", "warm_s", "snapshot_ref", "vs_snapshot", "short_of_snapshot"} <= set(s)
    if figures["snapshot_reference_available"]:
        assert s["snapshot_ref"] == rows[0]["prompt_tokens"] and s["vs_snapshot"] == 1.0
    else:  # until the oracle computes it, the second reference is n/a
        assert s["snapshot_ref"] is None and s["vs_snapshot"] is None
    target = hybrid["target"]["growing_chat"]
    assert target["more_than_every_peer"] and target["peers_cached"] == {}
    table = [ln for ln in out.splitlines() if ln.startswith("| ")]
    assert len(table) == 2 + 1 and table[2].startswith("| hybrid | growing_chat | reference | ")


@pytest.mark.parametrize("run", ["", "families_side_by_side_hybrid"])
def test_families_table_is_the_one_in_docs_benchmarks(
    capsys: pytest.CaptureFixture[str], run: str
) -> None:
    import families_side_by_side as fam

    root = Path(__file__).resolve().parent.parent
    results = root / "benchmarks" / "results" / run / "families_side_by_side.json"
    assert fam.main(["--table", str(results)]) == 0
    out = capsys.readouterr().out
    table = [ln for ln in out.splitlines() if ln.startswith("|")]
    figures = json.loads(results.read_text())
    rows = sum(len(w) for f in figures["families"].values() for w in f["workloads"].values())
    assert len(table) == 2 + rows
    doc = (root / "docs" / "benchmarks.md").read_text()
    assert all(line in doc for line in table)  # docs/benchmarks.md shows what the JSON says
    assert figures["command"] in doc


def test_parallel_streams_markdown_is_the_table_in_docs_benchmarks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import verify_throughput

    root = Path(__file__).resolve().parent.parent
    results = root / "benchmarks" / "results" / "verify_throughput.json"
    assert verify_throughput.main(["--markdown", str(results)]) == 0
    table = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("|")]
    figures = json.loads(results.read_text())
    counted = [r for t in figures["targets"] for r in t["rounds"] if not r.get("warmup")]
    assert len(table) == 2 + len(counted)  # header, rule, one row per counted round
    doc = (root / "docs" / "benchmarks.md").read_text()
    assert all(line in doc for line in table)  # docs/benchmarks.md shows what the JSON says
    for r in counted:  # both paths served the same requests, and passed
        runs = [v for v in r.values() if isinstance(v, dict)]
        assert len({v["requests"] for v in runs}) == 1 and not any(v["failures"] for v in runs)


def test_family_verification_rows_are_the_table_in_docs_reference_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import families_verify

    root = Path(__file__).resolve().parent.parent
    doc = (root / "docs" / "reference-engine.md").read_text()
    for name in ("families.json", "quiet/families.json"):
        results = root / "benchmarks" / "results" / "families" / name
        assert families_verify.main(["--markdown", str(results)]) == 0
        table = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("|")]
        rows = json.loads(results.read_text())
        assert len(table) == 2 + len(rows)
        assert all(line in doc for line in table)  # the doc shows what the JSON says
        for r in rows:  # every family passed exactly, the user's own command
            assert (r["verdict"], r["worst_diff"], r["exit"]) == ("pass", 0.0, 0)
            assert r["command"].startswith(
                f"HF_HUB_OFFLINE=1 .venv/bin/prefixcache verify --model {r['model']} "
            )
    assert "python benchmarks/families_verify.py --models" in doc  # and the one that made them
    # negative control: a row whose figures changed is not the doc's
    changed = dict(rows[0], requests=rows[0]["requests"] + 1)
    assert families_verify.markdown([changed]).splitlines()[-1] not in doc


def test_families_target_compares_warm_time_with_the_fastest_peer() -> None:
    import families_side_by_side as fam

    def engine(cached: int, warm: float) -> dict[str, Any]:
        return {"summary": {"cached_tokens": cached, "warm_s": warm, "vs_snapshot": 1.0}}

    per = {"reference": engine(90, 2.0), "a": engine(80, 4.0), "b": engine(0, 2.5)}
    per["c"] = {"error": "request 0: EngineError: refused"}  # a failed peer is not timed
    t = fam.target(per)
    assert t is not None and t["best_peer_warm"] == {"engine": "b", "warm_s": 2.5}
    assert t["warm_over_best_peer"] == 2.0 / 2.5 and t["more_than_every_peer"]
    per["a"] = engine(80, 1.0)  # a faster peer: the reference is then behind it
    assert fam.target(per)["warm_over_best_peer"] == 2.0  # type: ignore[index]
    assert fam.target({"reference": engine(90, 2.0)})["warm_over_best_peer"] is None  # type: ignore[index]
    assert set(fam.FAMILIES) == {"hybrid", "sliding-window", "kv-shared"}
