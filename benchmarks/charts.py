"""PNG charts of a ``side_by_side.py`` result: reuse per turn and time to first token per turn.

    python benchmarks/charts.py benchmarks/results/side_by_side_tiny.json   # redraw from JSON

matplotlib when installed (``pip install matplotlib``); otherwise nothing is drawn and the
caller is told so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

COLORS = {
    "reference": "tab:blue",
    "mlx-vlm APC block": "tab:red",
    "mlx-vlm APC snapshot": "tab:orange",
    "mlx-lm prompt cache": "tab:green",
}


def write_charts(figures: dict[str, Any], out: Path) -> list[Path]:
    """Write reuse_<size>.png and ttft_<size>.png into ``out``; return their paths."""
    import atexit
    import os
    import shutil
    import tempfile

    # matplotlib caches fonts under ~/.cache/matplotlib by default: keep it out of ~/.cache,
    # and out of the temp dir once the process ends
    if "MPLCONFIGDIR" not in os.environ:
        os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="prefixcache-mpl-")
        atexit.register(shutil.rmtree, os.environ["MPLCONFIGDIR"], ignore_errors=True)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        print("matplotlib is not installed: no charts (pip install matplotlib)")
        return []
    size = figures["size"]
    loads = figures["workloads"]
    paths = []
    for kind in ("reuse", "ttft"):
        fig, axes = plt.subplots(2, 2, figsize=(11, 8), squeeze=False)
        for ax, (wname, per_engine) in zip(axes.flat, loads.items()):
            for ename, result in per_engine.items():
                rows = result["requests"]
                turns = range(1, len(rows) + 1)
                color = COLORS.get(ename)
                if kind == "reuse":
                    ax.plot(turns, [r["cached_tokens"] for r in rows], "o-", color=color,
                            label=ename)  # fmt: skip
                    if ename == "reference":
                        ax.plot(turns, [r["oracle_max"] for r in rows], "k--", lw=1,
                                label="oracle maximum")  # fmt: skip
                else:
                    ax.plot(turns, [r["warm_s"] for r in rows], "o-", color=color,
                            label=f"{ename} warm")  # fmt: skip
                    ax.plot(turns, [r["cold_s"] for r in rows], ":", color=color,
                            label=f"{ename} cold")  # fmt: skip
                    if ename == "reference":
                        ax.plot(turns, [r["limit_s"] for r in rows], "k--", lw=1,
                                label="limit (reference)")  # fmt: skip
            ax.set_title(wname)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("request")
            ax.set_ylabel("cached tokens" if kind == "reuse" else "time to first token (s)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        title = "reused tokens per request" if kind == "reuse" else "time to first token"
        fig.suptitle(f"{title}: {figures['model']} (repeats {figures['repeats']})")
        fig.tight_layout()
        path = out / f"{kind}_{size}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        for png in write_charts(json.loads(Path(arg).read_text()), Path(arg).parent):
            print(f"wrote {png}")
