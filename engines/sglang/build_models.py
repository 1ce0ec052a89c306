"""Build the tiny HF-format models for SGLang with SGLang's own interpreter:
``VENV_PYTHON engines/sglang/build_models.py --out DIR``.

The models are ``reference_engine.fixtures.hf_models``' (the ones vLLM on CPU runs: heads of
32). ``reference_engine/__init__`` imports mlx, which SGLang's venv lacks: only its
``fixtures`` subpackage is needed, so the package is registered without running its
``__init__``. SGLang 0.5.23's Qwen2-VL vision tower reads ``in_chans`` from the vision config
(transformers writes ``in_channels``): it is added to the written config.json.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    package = types.ModuleType("reference_engine")
    package.__path__ = [str(ROOT / "reference_engine")]
    sys.modules.setdefault("reference_engine", package)
    from reference_engine.fixtures.hf_models import HF_QWEN2_VL_DIR
    from reference_engine.fixtures.hf_models import main as build

    code = build(argv)
    out = Path(argv[argv.index("--out") + 1])
    config_path = out / HF_QWEN2_VL_DIR / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    vision = config["vision_config"]
    vision.setdefault("in_chans", vision.get("in_channels", 3))
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
