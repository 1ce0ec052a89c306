"""mlx-vlm 0.7.10's continuous batching of Gemma 3 image requests, in process (no server).

The finding behind ``engines/mlx-vlm/counterexamples/gemma3-image-wave-mask-concat`` (the
mlx_vlm.server waves row of engines/mlx-vlm/runs.toml): two image requests of different prompt
lengths in flight together make the whole batch fail, every request in it answered HTTP 500
("[concatenate] All the input array dimensions must match exactly ..."). What the server does
(mlx_vlm 0.7.10): ``server/generation.py`` ``ResponseGenerator._gpu_embed`` hands the
``BatchGenerator`` every non-None field of ``model.get_input_embeddings(...)`` as the request's
prompt kwargs; Gemma 3's (``models/gemma3/gemma3.py`` ``prepare_inputs_for_multimodal``) include
``attention_mask_4d``, one ``(1, 1, L, L)`` mask per request of ``L`` tokens. Both batch
builders of ``generate/ar.py`` (``_merge_prefill_prompt_kwargs``, the cold path, and
``BatchGenerator._build_mixed_prompt_batch``, the APC warm/cold path) pad only the kwargs named
in ``_SEQUENCE_ALIGNED_PROMPT_KWARGS`` (not ``attention_mask_4d``) and concatenate the rest on
axis 0 (``_concat_prompt_kwarg_rows``): masks of two lengths do not concatenate. Bug zoo class
10 (concurrency: a per-row input merged without its row's shape). Qwen2-VL returns no such mask,
which is why its waves pass (docs/engines.md).

Our tools are out of it: no tap (this runs mlx-vlm's own classes as the server builds them), no
cache (a fresh ``BatchGenerator`` without APC: the cold path), no tolerance (it raises); the
server run was replayed without the tap too (engines/mlx-vlm/NOTES.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

mx = pytest.importorskip("mlx.core")
mlx_vlm = pytest.importorskip("mlx_vlm")

from PIL import Image  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VERSION = getattr(mlx_vlm, "__version__", "?")
SHORT = "describe the image"
LONG = "what colour is it, what colour is it, thanks"  # 12 more tokens than SHORT


@pytest.fixture(scope="module")
def vlm() -> tuple[Any, Any]:
    mx.set_default_device(mx.cpu)
    return mlx_vlm.load(str(ROOT / "fixtures" / "tiny-gemma3"))


def request(vlm: tuple[Any, Any], text: str, image: bool) -> tuple[list[int], dict[str, Any]]:
    """A chat request's prompt ids and prompt kwargs, built as ``_gpu_embed`` builds them."""
    from mlx_vlm.prompt_utils import apply_chat_template
    from mlx_vlm.utils import prepare_inputs

    model, processor = vlm
    images = [Image.new("RGB", (64, 64), (200, 10, 10))] if image else None
    prompt = apply_chat_template(processor, model.config, text, num_images=1 if image else 0)
    inputs = prepare_inputs(
        processor, images=images, prompts=prompt, image_token_index=model.config.image_token_index
    )
    embed = model.get_input_embeddings(
        inputs["input_ids"], inputs.get("pixel_values"), mask=inputs.get("attention_mask")
    )
    kwargs = {k: v for k, v in embed.to_dict().items() if v is not None}
    return inputs["input_ids"][0].tolist(), kwargs


def serve(vlm: tuple[Any, Any], texts: list[str], image: bool = True) -> dict[int, list[int]]:
    """The requests inserted together into one ``BatchGenerator`` (as the server does, on its
    language model), 2 greedy tokens each: uid -> tokens."""
    from mlx_vlm.generate.ar import BatchGenerator

    model, processor = vlm
    gen = BatchGenerator(model.language_model, processor, max_tokens=2)
    reqs = [request(vlm, t, image) for t in texts]
    gen.insert(
        [ids for ids, _ in reqs], max_tokens=[2] * len(reqs), prompt_kwargs=[k for _, k in reqs]
    )
    out: dict[int, list[int]] = {}
    for _ in range(50):
        got = gen.next()
        for r in got[1] if isinstance(got, tuple) else got:
            out.setdefault(r.uid, []).append(int(r.token))
        if len(out) == len(reqs) and all(len(v) >= 2 for v in out.values()):
            break
    return out


def test_control_the_two_image_prompts_differ_in_length(vlm: tuple[Any, Any]) -> None:
    (short, kw), (long, _) = request(vlm, SHORT, True), request(vlm, LONG, True)
    assert len(short) < len(long)
    assert kw["attention_mask_4d"].shape == (1, 1, len(short), len(short))


def test_control_image_requests_of_one_length_batch_as_served_alone(
    vlm: tuple[Any, Any],
) -> None:
    """Two image requests of the same length batch, and each gets what it gets alone."""
    alone = serve(vlm, [SHORT])[0]
    assert list(serve(vlm, [SHORT, SHORT]).values()) == [alone, alone]


def test_control_text_requests_of_different_lengths_batch(vlm: tuple[Any, Any]) -> None:
    """No image, no 4D mask: rows of different lengths batch (left-padded)."""
    assert len(serve(vlm, [SHORT, LONG], image=False)) == 2


@pytest.mark.xfail(
    VERSION == "0.7.10",
    reason="mlx-vlm 0.7.10: Gemma 3's attention_mask_4d of each image request is concatenated "
    "unpadded across rows (generate/ar.py _concat_prompt_kwarg_rows)",
    raises=ValueError,
    strict=True,
)
def test_image_requests_of_different_lengths_batch(vlm: tuple[Any, Any]) -> None:
    assert len(serve(vlm, [SHORT, LONG])) == 2


def test_control_the_masks_padded_to_one_size_batch(
    vlm: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cause pinned: with each row's ``attention_mask_4d`` left-padded to the longest row
    before ``_concat_prompt_kwarg_rows`` (as the cold path left-pads the rows' embeddings),
    the same two requests batch."""
    from mlx_vlm.generate import ar

    concat = ar._concat_prompt_kwarg_rows

    def padded(key: str, rows: list[Any]) -> Any:
        if key == "attention_mask_4d":
            size = max(r.shape[-1] for r in rows)
            pads = [size - r.shape[-1] for r in rows]
            rows = [mx.pad(r, [(0, 0), (0, 0), (p, 0), (p, 0)]) for r, p in zip(rows, pads)]
        return concat(key, rows)

    monkeypatch.setattr(ar, "_concat_prompt_kwarg_rows", padded)
    assert len(serve(vlm, [SHORT, LONG])) == 2
