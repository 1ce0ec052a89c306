"""Saving a mutant's shrunk counterexample as a regression case (fixtures/corpus/mutants/).

The files use the scenario-corpus format (``pytest_prefixcache.output.streams``), plus the mutant's
name and expected check. They live in a subdirectory of the corpus, which the plugin's
``corpus_files`` (one directory level) does not pick up yet; ``tests/test_mutants_detection.py``
replays each against its mutant and against the unmodified engine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pytest_prefixcache.output.streams import stream_to_json

from .table import Detection

__all__ = ["save_counterexample"]

#: The default directory, and where the images go, relative to it.
DEFAULT_DIR = "fixtures/corpus/mutants"
IMAGES = "images"


def save_counterexample(row: Detection, directory: str | os.PathLike[str]) -> Path:
    """Write ``mutant_<name>.json`` (and its images as PNGs under ``images/``)."""
    out = Path(directory)
    (out / IMAGES).mkdir(parents=True, exist_ok=True)
    for req in row.stream:
        for img in req.images:
            path = out / IMAGES / f"img-{img.digest[:16]}.png"
            if not path.exists():
                img.to_pil().save(path, format="PNG")
    description = (
        f"Shrunk counterexample for the bug-zoo mutant {row.name} (class {row.bug_class}): "
        f"caught by {row.shrunk_check}. {row.headline}"
    )
    data = stream_to_json(row.stream, description)
    for r in data["requests"]:
        for m in r["messages"]:
            m["content"] = [
                {"image": f"{IMAGES}/{p['image']}"} if isinstance(p, dict) else p
                for p in m["content"]
            ]
    # sent as waves; restarts between requests
    data.update({k: v for k, v in row.meta.items() if k in ("waves", "restarts")})
    data["mutant"] = row.name
    data["expected_check"] = row.expected
    path = out / f"mutant_{row.name}.json"
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path
