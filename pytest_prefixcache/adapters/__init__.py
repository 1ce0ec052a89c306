"""Ready adapters that put real engines behind the :class:`~pytest_prefixcache.Engine` protocol.

Each module is importable on its own and imports its engine's packages only when an adapter
is built, so importing this package costs nothing:

- :mod:`.mlx_lm`: mlx-lm in-process, its ``LRUPromptCache`` and ``stream_generate`` path (text).
- :mod:`.mlx_vlm_apc`: mlx-vlm in-process with Automatic Prefix Caching (images), in its block
  mode or its exact-snapshot mode, disk tier off.
- :mod:`.http`: the OpenAI-compatible HTTP adapter's modules: :mod:`.http.openai`
  (``OpenAIEngine``: any server, started from a command line or reached at a URL, with a cold
  baseline by restart, cache reset, a cache-less server or a salt), its server processes
  (``server``, ``fresh``, ``forkserver``), requests and replies (``chat``, ``replies``,
  ``prompt_ids``, ``render``, ``resets``, ``baselines``), the logit tap's reader (``tapped``)
  and claims (``claims``, ``claim_sources``). :mod:`.openai` re-exports ``OpenAIEngine``
  under its old path.
- :mod:`.presets`: ready HTTP setups (reference server, mlx_lm.server, mlx_vlm.server, vLLM,
  llama-server) and ``from_env`` (configured by ``PREFIXCACHE_*`` variables).
- :mod:`.omlx`, :mod:`.sglang`: oMLX and SGLang on the HTTP adapter.
- :mod:`.seed`: the seed engines (vllm-mlx, rapid-mlx) with any serve flags under the logit
  tap, with their claim sources: ``seed_server(engine, flags)``, a matrix engine factory (used
  by engines/seed/run.sh and engines/seed/matrix.toml).

Every adapter has a zero-argument factory, so it can be named on the command line, e.g.
``--prefixcache-engine=pytest_prefixcache.adapters.mlx_lm:tiny_llama``. Adapters say
``supports_images`` and ``supports_namespaces``.
"""

from __future__ import annotations

__all__: list[str] = []
