"""The OpenAI-compatible HTTP adapter (:class:`.openai.OpenAIEngine`) and the modules it is
made of: server processes (:mod:`.server`, :mod:`.fresh`, :mod:`.forkserver`), request bodies
and replies (:mod:`.chat`, :mod:`.replies`, :mod:`.prompt_ids`, :mod:`.render`), cache resets
and cold baselines (:mod:`.resets`, :mod:`.baselines`), the logit tap's records
(:mod:`.tapped`), what a server claims (:mod:`.claims`, :mod:`.claim_sources`) and the
adapter's settings as it reads them (:mod:`.engine_settings`). Each is imported on its own;
this package imports none of them."""

from __future__ import annotations

__all__: list[str] = []
