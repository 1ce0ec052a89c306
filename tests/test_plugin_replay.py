"""Failing streams are saved as JSON + PNGs and --prefixcache-replay replays exactly them."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from plugin_support import run_suite, with_fakes

from pytest_prefixcache import Image, Message, Request, load_stream, save_stream
from pytest_prefixcache.images import make_image, reencode
from pytest_prefixcache.output.streams import corpus_files, stream_id

pytest_plugins = ["pytester"]


def _replay_path(stdout: str) -> str:
    found = re.search(r"replay --run=\S+ (\S+/stream\.json)", stdout)
    assert found, stdout
    return found.group(1)


@pytest.mark.slow
def test_failure_is_saved_and_replays_exactly(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    first = run_suite(pytester, "ignore_digest", "-k", "request_streams", examples=30)
    first.assert_outcomes(failed=1)
    path = _replay_path(first.stdout.str())
    saved = pytester.path / path
    assert saved.is_file()
    data = json.loads(saved.read_text())
    assert data["format"] == "pytest-prefixcache/stream/v1" and data["check"] == "equivalence"
    pngs = sorted(p.name for p in saved.parent.glob("*.png"))
    assert pngs and all(p.startswith("img-") for p in pngs)
    stream, _ = load_stream(saved)
    assert stream_id(stream) == saved.parent.name

    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    again = pytester.runpytest(
        "--prefixcache-engine=fakeengines:ignore_digest", f"--prefixcache-replay={path}", "-v"
    )
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(
        [
            "*verification.py::test_replay FAILED*",
            "E   pytest_prefixcache.errors.EquivalenceFailure: equivalence: *",
            f"E     at request {len(stream) - 1} of a stream of {len(stream)} (counting from 0)",
            f"E     replay: * -m pytest_prefixcache.cli replay --run=* {path}",
        ]
    )
    assert "test_mine" not in again.stdout.str()  # a replay runs nothing else
    again.stdout.fnmatch_lines(["prefixcache: * deselected: a replay runs only test_replay"])
    again.stdout.fnmatch_lines(["*- prefixcache replay -*", f"* replay --run=* {path}"])

    fixed = pytester.runpytest(
        "--prefixcache-engine=fakeengines:good", f"--prefixcache-replay={saved.parent}"
    )
    fixed.assert_outcomes(passed=1)


def test_replay_of_a_corrupt_file_says_what_is_wrong(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makefile(".json", bad='{"format": "something else"}')
    result = pytester.runpytest(
        "--prefixcache-engine=fakeengines:good", "--prefixcache-replay=bad.json"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # a usage error, not a failed check
    result.stderr.fnmatch_lines(
        ["ERROR: --prefixcache-replay=bad.json: stream file *bad.json* does not declare format*"]
    )


def test_corpus_runs_first_and_a_project_corpus_is_added(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    red = {"pattern": "solid", "width": 32, "height": 32, "color": [255, 0, 0]}
    mine = {
        "format": "pytest-prefixcache/stream/v1",
        "images": {"red": red},
        "requests": [
            {"messages": [{"role": "user", "content": ["colour?", {"image": "red"}]}]},
            {"messages": [{"role": "user", "content": ["colour?", {"image": "red"}]}]},
        ],
    }
    (pytester.path / "fixtures" / "corpus").mkdir(parents=True)
    (pytester.path / "fixtures" / "corpus" / "zz_mine.json").write_text(json.dumps(mine))
    result = run_suite(pytester, "good", "-v")
    lines = [ln for ln in result.stdout.lines if ln.startswith("verification.py::")]
    names = [ln.split("::")[1].split()[0] for ln in lines]
    assert names[:6] == [
        "test_corpus[agent_loop_growing_turns]",
        "test_corpus[claude_code_billing_header]",
        "test_corpus[omlx_image_edit_a_to_e]",
        "test_corpus[photo_extraction_shared_prompt]",
        "test_corpus[three_images_red_blue_green]",
        "test_corpus[zz_mine]",
    ]
    # test_waves runs only on an engine that declares max_concurrency
    assert names[6:] == ["test_request_streams", "test_waves", "test_state_machine"]
    result.assert_outcomes(passed=8, skipped=1)
    # the "1 deselected" of every default run says which test and why
    result.stdout.fnmatch_lines(
        ["prefixcache: 1 deselected: test_replay, which runs only with --prefixcache-replay=PATH*"]
    )


def test_the_corpus_scenarios_load() -> None:
    files = {f.stem: f for f in corpus_files()}
    assert set(files) >= {
        "agent_loop_growing_turns",
        "omlx_image_edit_a_to_e",
        "photo_extraction_shared_prompt",
        "three_images_red_blue_green",
    }
    rgb, meta = load_stream(files["three_images_red_blue_green"])
    assert "collision" in meta["description"]
    sizes = {img.size for r in rgb for img in r.images}
    assert sizes == {(64, 64)}
    assert rgb[5].images[0] == rgb[0].images[0]  # the BMP round trip is the same image
    photos, _ = load_stream(files["photo_extraction_shared_prompt"])
    assert len({img.size for r in photos for img in r.images}) >= 5
    assert len({r.messages[0] for r in photos}) == 1  # one shared system prompt
    agent, _ = load_stream(files["agent_loop_growing_turns"])
    for before, after in itertools.pairwise(agent):
        assert after.messages[: len(before.messages)] == before.messages


def test_save_and_load_round_trip(tmp_path: object) -> None:
    a, b = make_image("noise", 20, 30, seed=1), make_image("text", 48, 16, seed=2)
    stream = (
        Request((Message("user", ("hi", a, b)),), namespace="t", max_new_tokens=2),
        Request(
            (Message("system", ("s",)), Message("user", (reencode(a, "BMP"),))),
        ),
    )
    path = save_stream(stream, tmp_path / "x", check="fault")  # type: ignore[operator]
    loaded, meta = load_stream(path)
    assert loaded == stream and meta["check"] == "fault"
    assert isinstance(loaded[1].messages[1].content[0], Image)
    assert stream_id(loaded) == stream_id(stream)


FLAKY_ENGINE = """
import dataclasses
from fakeengines import FakeEngine


class CorruptOnce(FakeEngine):
    calls = 0

    def run(self, request, *, use_cache):
        out = super().run(request, use_cache=use_cache)
        if use_cache:
            CorruptOnce.calls += 1
            if CorruptOnce.calls == 5:  # one cached answer, once: its replay passes
                out = dataclasses.replace(out, logits=out.logits + 1.0)
        return out


def corrupt_once():
    return CorruptOnce()
"""


def test_a_flaky_failure_is_reported_and_saved(pytester: pytest.Pytester) -> None:
    """Hypothesis raises FlakyFailure (an exception group) when a failing example passes on
    replay: the report still names the check, marks it flaky and saves the stream."""
    with_fakes(pytester)
    pytester.makepyfile(flaky=FLAKY_ENGINE)
    res = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-engine=flaky:corrupt_once",
        "--prefixcache-examples=20", "--prefixcache-seed=1", "--prefixcache-database=none",
        "-k", "request_streams", "--prefixcache-report=r.json",
    )  # fmt: skip
    res.assert_outcomes(failed=1)
    assert "Flaky" in res.stdout.str()
    (failure,) = json.loads((pytester.path / "r.json").read_text())["failures"]
    assert failure["check"] == "equivalence"
    assert failure["summary"].startswith("flaky (FlakyFailure): equivalence")
    assert (pytester.path / _replay_path(res.stdout.str())).is_file()
