"""Run by tests/test_tap_families.py in a subprocess: install the tap's default targets, run
tiny random models of the hybrid and sliding-window families (built in memory from small
configs), and print what the tap recorded. A subprocess, because installing the tap wraps the
model classes for the life of the process."""

from __future__ import annotations

import json
import os
import sys

import mlx.core as mx


def qwen3_5_text() -> object:
    from mlx_lm.models import qwen3_5

    text = {
        "model_type": "qwen3_5_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 97,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "full_attention_interval": 4,
        "rope_parameters": {
            "type": "default",
            "mrope_section": [2, 1, 1],
            "rope_theta": 10000,
            "partial_rotary_factor": 0.25,
        },
    }
    return qwen3_5.Model(qwen3_5.ModelArgs(model_type="qwen3_5", text_config=text))


def gemma3_text() -> object:
    from mlx_lm.models import gemma3_text as g

    return g.Model(
        g.ModelArgs.from_dict(
            {
                "model_type": "gemma3_text",
                "hidden_size": 64,
                "num_hidden_layers": 4,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "head_dim": 16,
                "num_key_value_heads": 2,
                "vocab_size": 97,
                "sliding_window": 4,
                "sliding_window_pattern": 2,
                "query_pre_attn_scalar": 16,
            }
        )
    )


def main() -> int:
    from pytest_prefixcache.tap import TapReader
    from pytest_prefixcache.tap.wrap import DEFAULT_TARGETS, install

    targets = sys.argv[1].split(",") if len(sys.argv) > 1 else DEFAULT_TARGETS
    wrapped = install(targets=targets)
    out: dict[str, object] = {"wrapped": wrapped, "missing": sorted(set(targets) - set(wrapped))}
    reader = TapReader(os.environ["PREFIXCACHE_TAP"])
    calls = {}
    for name, build in (("qwen3_5", qwen3_5_text), ("gemma3_text", gemma3_text)):
        model = build()
        mx.eval(model.parameters())
        cache = model.make_cache()
        model(mx.array([[1, 2, 3, 4, 5, 6, 7]]), cache=cache)  # wraps the ring (window 4)
        model(mx.array([[8]]), cache=cache)
        calls[name] = [(r.cls, r.n_inputs, r.offset) for r in reader.read_new()]
    out["calls"] = calls
    out["installed"] = reader.installed
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
