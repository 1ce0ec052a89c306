"""The reference engine on tiny-gemma4: its cold prefill is mlx-vlm's own (``get_input_embeddings``
then the language model on a fresh cache), image or not. The two Gemma 4 hooks of the family are
what make it so (negative controls): the token rows scaled by sqrt(hidden) (Gemma 4's language
model takes ``inputs_embeds`` as they are) and the per-layer-input ids with 0 for image tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_vlm")

from test_engine import SYSTEM, img, req, user  # noqa: E402

from pytest_prefixcache.adapters.http.render import VlmRenderer  # noqa: E402
from pytest_prefixcache.package_data import fixture_model  # noqa: E402
from reference_engine import Engine  # noqa: E402
from reference_engine.families import Family, Gemma4  # noqa: E402
from reference_engine.model import LoadedModel, load_model  # noqa: E402

REQUESTS = {
    "text": req(SYSTEM, user("Describe something else entirely, with no image at all.")),
    "image": req(SYSTEM, user("Describe this picture, please, in a few words.", img(1))),
}


@pytest.fixture(scope="module")
def gemma4() -> LoadedModel:
    return load_model(fixture_model("tiny-gemma4"))


def mlx_vlm_logits(model: LoadedModel, request: Any) -> Any:
    """The prompt's last logits the way mlx-vlm's generate prefills it."""
    from PIL import Image as PILImage

    ids, _ = VlmRenderer(fixture_model("tiny-gemma4"))(request)
    vlm, processor = model.model, model.processor
    pixels = None
    for image in request.images:
        pil: PILImage.Image = image.to_pil()
        data, _ = processor.image_processor(images=[pil])
        pixels = mx.array(np.asarray(data["pixel_values"]))
    features = vlm.get_input_embeddings(input_ids=mx.array([list(ids)]), pixel_values=pixels)
    lm = vlm.language_model
    out = lm(
        None, inputs_embeds=features.inputs_embeds, per_layer_inputs=features.per_layer_inputs,
        cache=lm.make_cache(),
    )  # fmt: skip
    return out.logits[0, -1].astype(mx.float32)


def engine_logits(model: LoadedModel, request: Any) -> np.ndarray:
    return np.asarray(Engine(model).run(request, use_cache=False).logits)


@pytest.mark.parametrize("kind", sorted(REQUESTS))
def test_the_cold_prefill_is_mlx_vlms(gemma4: LoadedModel, kind: str) -> None:
    request = REQUESTS[kind]
    want = np.asarray(mlx_vlm_logits(gemma4, request))
    assert np.max(np.abs(engine_logits(gemma4, request) - want)) < 1e-4


@pytest.mark.parametrize(
    ("hook", "kind"), [("text_rows", "text"), ("text_rows", "image"), ("language_ids", "image")]
)
def test_each_gemma4_hook_matters(
    gemma4: LoadedModel, monkeypatch: pytest.MonkeyPatch, hook: str, kind: str
) -> None:
    request = REQUESTS[kind]
    want = np.asarray(mlx_vlm_logits(gemma4, request))
    assert isinstance(gemma4.family, Gemma4)
    monkeypatch.setattr(gemma4.family, hook, getattr(Family, hook).__get__(gemma4.family))
    assert np.max(np.abs(engine_logits(gemma4, request) - want)) > 1e-2
