"""Build the tiny HF-format models (reference_engine.fixtures.hf_models) in an environment
without MLX, such as vLLM's venv: ``VENV_PYTHON engines/lab/build_hf_models.py --out DIR``.

``reference_engine/__init__`` imports mlx; only its ``fixtures`` subpackage (tokenizer, configs,
weights) is needed here, so the package is registered without running its ``__init__``;
``pytest_prefixcache`` (where the fixtures are: ``package_data``) is imported from this
checkout. torch and transformers come from the running interpreter.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    package = types.ModuleType("reference_engine")
    package.__path__ = [str(ROOT / "reference_engine")]
    sys.modules.setdefault("reference_engine", package)
    from reference_engine.fixtures.hf_models import main

    sys.exit(main(sys.argv[1:]))
