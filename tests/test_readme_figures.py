"""The README's measured figures are the ones benchmarks/readme_figures.py wrote."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import readme_figures  # noqa: E402


def _figures() -> dict[str, dict[str, object]]:
    return json.loads(readme_figures.RESULTS.read_text(encoding="utf-8"))


def test_the_readme_s_figures_are_the_measured_ones() -> None:
    readme = readme_figures.README.read_text(encoding="utf-8")
    figures = _figures()
    assert set(readme_figures.SPAN.findall(readme)) and {
        name for name, _ in readme_figures.SPAN.findall(readme)
    } == set(readme_figures.RUNS), "every figure of the script has its span in the README"
    assert readme_figures.rewrite(readme, figures) == readme, (
        "README.md: run python benchmarks/readme_figures.py --render (or measure again)"
    )
    for name, f in figures.items():  # each figure names what produced it
        assert str(f["command"]).startswith("pytest --prefixcache-verify"), name
        assert f["date"] and f["wall_s"] > 0


def test_a_changed_figure_is_seen() -> None:
    """Negative control: a figure that differs from the README's is a difference."""
    readme = readme_figures.README.read_text(encoding="utf-8")
    figures = copy.deepcopy(_figures())
    figures["mutant"]["requests"] = int(figures["mutant"]["requests"]) + 1  # type: ignore[call-overload]
    assert readme_figures.rewrite(readme, figures) != readme
