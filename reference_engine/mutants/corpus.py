"""Saving a mutant's shrunk counterexample into the scenario corpus (fixtures/corpus/)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pytest_prefixcache.replay import stream_to_json

from .table import Detection

__all__ = ["save_counterexample"]

#: Where the corpus files' images go, relative to the corpus directory.
IMAGES = "mutant_images"


def save_counterexample(row: Detection, directory: str | os.PathLike[str]) -> Path:
    """Write ``mutant_<name>.json`` (and its images as PNGs under ``mutant_images/``)."""
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
    data["mutant"] = row.name
    data["expected_check"] = row.expected
    path = out / f"mutant_{row.name}.json"
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path
