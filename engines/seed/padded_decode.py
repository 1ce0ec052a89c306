"""One batched decode step of two image requests of unequal lengths, as rapid-mlx 0.16.10's MLLM
lane runs it, on an engine environment's own libraries (run with that venv's python).

``MLLMBatchGenerator._process_prompts`` prefills each request alone (a ``KVCache`` per layer),
merges the caches into mlx-lm's ``BatchKVCache`` (the shorter row left-padded), and
``MLLMBatchGenerator._step`` calls ``self.language_model(input_tokens, cache=cache)``: no mask,
the model's own ``_rope_deltas`` (the last prefill's). This script does the same with the
installed mlx-vlm and mlx-lm, no server and no logit tap, and prints one JSON object: each
row's largest |difference| from the same request decoded alone, with the server's inputs, with
per-row rope deltas, and beside a row of its own length (no padding), plus the versions.

    python engines/seed/padded_decode.py MODEL_DIR IMAGE
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any


def main(model_dir: str, image: str) -> dict[str, Any]:
    import mlx.core as mx
    import mlx_lm
    import mlx_vlm
    from mlx_lm.models.cache import BatchKVCache, make_prompt_cache
    from mlx_vlm import load
    from mlx_vlm.utils import prepare_inputs

    model, processor = load(model_dir)
    template: Any = processor.apply_chat_template
    lm = model.language_model

    def render(turns: list[tuple[str, str, bool]]) -> str:
        msgs = [
            {
                "role": r,
                "content": ([{"type": "image"}] if im else []) + [{"type": "text", "text": t}],
            }
            for r, t, im in turns
        ]
        return str(template(msgs, add_generation_prompt=True, tokenize=False))

    # the saved wave's two requests (its stream.json): the same image, other texts
    prompts = [
        render([("user", "describe the image", True)]),
        render(
            [
                ("user", "describe the image", True),
                ("assistant", "describe the image", False),
                ("user", "describe the image, describe the image", False),
            ]
        ),
    ]

    def logprobs(out: Any) -> Any:
        last = (out.logits if hasattr(out, "logits") else out)[:, -1].astype(mx.float32)
        return last - mx.logsumexp(last, axis=-1, keepdims=True)

    rows = []
    for prompt in prompts:  # each prefilled alone, as _process_prompts does
        inputs = prepare_inputs(processor, images=[image], prompts=prompt)
        cache = make_prompt_cache(lm)
        out = model(
            inputs["input_ids"],
            pixel_values=inputs["pixel_values"],
            cache=cache,
            image_grid_thw=inputs.get("image_grid_thw"),
            mask=inputs.get("attention_mask"),
        )
        first: int = mx.argmax(logprobs(out)[0]).item()  # type: ignore[assignment]
        rows.append((int(inputs["input_ids"].shape[1]), cache, first, lm._rope_deltas))

    def decode(caches: list[Any], tokens: list[int], delta: Any) -> Any:
        batch = [
            BatchKVCache.merge([copy.deepcopy(c[i]) for c in caches]) for i in range(len(caches[0]))
        ]
        lm._rope_deltas, lm._position_ids = delta, None
        return logprobs(lm(mx.array([[t] for t in tokens]), cache=batch))

    alone = [decode([c], [t], d)[0] for _, c, t, d in rows]
    caches, tokens = [r[1] for r in rows], [r[2] for r in rows]

    def diffs(batched: Any) -> list[float]:
        return [float(mx.abs(batched[i] - alone[i]).max()) for i in range(len(alone))]

    own = decode([caches[0], caches[0]], [tokens[0]] * 2, rows[0][3])
    return {
        "mlx_vlm": mlx_vlm.__version__,
        "mlx_lm": mlx_lm.__version__,
        "prompt_tokens": [r[0] for r in rows],
        "rope_deltas": [r[3].tolist() for r in rows],
        "server": diffs(decode(caches, tokens, rows[-1][3])),
        "per_row_deltas": diffs(decode(caches, tokens, mx.concatenate([r[3] for r in rows]))),
        "no_padding": [float(mx.abs(own[0] - alone[0]).max())],
    }


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python engines/seed/padded_decode.py MODEL_DIR IMAGE")
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
