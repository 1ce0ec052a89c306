"""Zero-argument factories for the HTTP adapter, to name on the command line
(``--prefixcache-engine=pytest_prefixcache.adapters.presets:reference_server``).

Each starts its own servers on 127.0.0.1 and stops them at ``close()`` or interpreter exit.
The zero-argument ones load ``model_dir`` when given, else the model ``PREFIXCACHE_MODEL``
names (``--prefixcache-model``), else their tiny fixture; a model of the wrong kind (a
vision-language model for a text-only server, or the reverse) is refused before any server
starts.

One module per engine: :mod:`.reference`, :mod:`.mlx_lm`, :mod:`.mlx_vlm`, :mod:`.server`
(``from_env``) here; llama-server, oMLX, SGLang and vLLM in their adapters' modules. Every
preset is importable from here, as ``pytest_prefixcache.adapters.presets:NAME``.
"""

from __future__ import annotations

from ..environment import audit_share
from ..http.openai import OpenAIEngine
from ..http.render import TextRenderer, VlmRenderer
from ..llama import llama_server
from ..omlx import omlx_server
from ..sglang import sglang_server
from ..vllm import VLLM_ENV, VLLM_RESETS, vllm_matrix_engine, vllm_server
from .common import TAP
from .mlx_lm import mlx_lm_server
from .mlx_vlm import mlx_vlm_server
from .reference import reference_server
from .server import from_env

__all__ = [
    "TAP",
    "VLLM_ENV",
    "VLLM_RESETS",
    "OpenAIEngine",
    "TextRenderer",
    "VlmRenderer",
    "audit_share",
    "from_env",
    "llama_server",
    "mlx_lm_server",
    "mlx_vlm_server",
    "omlx_server",
    "reference_server",
    "sglang_server",
    "vllm_matrix_engine",
    "vllm_server",
]
