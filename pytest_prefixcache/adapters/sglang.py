"""SGLang's OpenAI server behind the HTTP adapter: the preset and its settings.

Read in SGLang 0.5.23 (``serving_chat.py``, ``protocol.py``, ``http_server.py``) and run on CPU
(engines/sglang/install.sh, engines/sglang/NOTES.md):

- top_logprobs entries carry no token id; each has the token's raw ``bytes`` (byte-level BPE
  tokenizers, through GPT-2's byte decoder): a ``kind="bytes"`` :class:`.replies.Vocabulary`
  names them, byte fragments included;
- ``return_token_ids`` gives the choice's ``prompt_token_ids`` and ``response_token_ids``;
- ``--enable-cache-report`` puts ``cached_tokens`` in ``usage.prompt_tokens_details``
  (without it: null); ``--enable-metrics``' counter ``sglang:cached_tokens_total`` says the
  same, a second claim source;
- ``cache_salt`` (a body field) is part of the radix cache's key: namespaces go there;
- ``/flush_cache`` (GET or POST) empties the radix cache: 200 and text, or 400 while requests
  are pending; ``--disable-radix-cache`` keeps no cache at all;
- the radix cache matches whole pages (``--page-size``, default 1): with pages of more than
  one token, reuse is judged against a block reference of that size.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from ..errors import EngineError
from ..package_data import model_config
from .http.claims import ApiField, ClaimWatch, MetricDelta
from .http.openai import OpenAIEngine
from .http.replies import Vocabulary
from .tolerances import engine_atol, engine_rule

__all__ = ["SGLANG_ENV", "SGLANG_RESETS", "SGLANG_VERSION", "sglang_command", "sglang_server"]

#: The version these settings were read in and measured on.
SGLANG_VERSION = "0.5.23"
#: SGLang's CPU settings that worked here: its CPU engine, one OpenMP thread per server (the
#: machine is shared),
#: its temporary files (ZMQ IPC sockets) under the server's private HOME, no telemetry.
SGLANG_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",  # is_cpu() is False without it, whatever --device says
    "OMP_NUM_THREADS": "1",
    "SGLANG_CPU_OMP_THREADS_BIND": "all",
    # its rotary embeddings are torch.compile'd: on CPU, inductor compiles C++ on the first
    # request of each new shape (an image request took 118 s here, past the HTTP timeout)
    "TORCHDYNAMO_DISABLE": "1",
    "TMPDIR": "{home}/tmp",
    "DO_NOT_TRACK": "1",
}
#: The radix cache's reset endpoint.
SGLANG_RESETS = ("POST /flush_cache",)
#: The baselines the preset can make (see :func:`sglang_server`).
COLD = ("server", "reset", "salt")

#: SGLang on CPU compiles kernels at start: minutes on a busy 2-core machine
START_TIMEOUT = 900.0


def _flag(flags: Sequence[str], name: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in ``flags`` (the last one wins)."""
    value = None
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif f.startswith(name + "="):
            value = f.partition("=")[2]
    return value


def page_size_of(flags: Sequence[str]) -> int:
    """The radix cache's page size ``flags`` set (SGLang's default on CPU: 1)."""
    raw = _flag(flags, "--page-size")
    if raw is None:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise EngineError(f"--page-size {raw!r} is not a positive int")
    return int(raw)


def sglang_command(
    model_dir: str | os.PathLike[str],
    flags: Sequence[str] = (),
    *,
    python: str = "python",
    cache_report: bool = True,
    metrics: bool = True,
) -> list[str]:
    """The server's command line (``{port}`` left to the adapter): CPU, torch-native
    attention, float32, no warm-up request (it would fill the cache before the first stream),
    then ``flags``."""
    cmd = [
        *shlex.split(python), "-m", "sglang.launch_server",
        "--model-path", os.fspath(model_dir), "--host", "127.0.0.1", "--port", "{port}",
        "--device", "cpu", "--attention-backend", "torch_native", "--dtype", "float32",
        "--skip-server-warmup", "--max-running-requests", "4", "--max-total-tokens", "16384",
        "--log-level", "warning",
    ]  # fmt: skip
    if cache_report:
        cmd.append("--enable-cache-report")
    if metrics:
        cmd.append("--enable-metrics")
    return [*cmd, *flags]


def sglang_server(
    model_dir: str | os.PathLike[str],
    flags: Sequence[str] = (),
    *,
    python: str = "python",
    cold: str = "server",
    cache_report: bool = True,
    metrics: bool = True,
    top_logprobs: int = 20,
    timeout: float = 600.0,
    start_timeout: float = START_TIMEOUT,
    audit: bool = True,
) -> OpenAIEngine:
    """SGLang's server (``python -m sglang.launch_server``; ``python``: the interpreter of
    SGLang's own environment, a command line) on a local HF-format model, on 127.0.0.1 with a
    kernel-chosen port and a private HOME, with ``flags`` added (a matrix combination:
    ``--disable-radix-cache``, ``--chunked-prefill-size N``, ``--page-size N``, ...).

    The uncached baseline (``cold``): ``"server"`` (default), a second server started with
    ``--disable-radix-cache`` (it has no cache to hit); ``"reset"``, a second server of the
    same flags whose radix cache ``/flush_cache`` empties before each uncached run;
    ``"salt"``, a fresh ``cache_salt`` on the one server. Every uncached reply must report
    ``cached_tokens`` 0 (with ``cache_report``), so the baseline proves itself cold.

    Token ids: SGLang's own (``return_token_ids``), top_logprobs entries named from their raw
    ``bytes`` (a byte-level tokenizer). Claims: ``cached_tokens`` and, with ``metrics``, the
    ``sglang:cached_tokens_total`` counter (compared with each other: there is no tap).
    Tolerance: the measured rule of ``tolerances.py`` (cached and flushed runs are not
    bit-identical on CPU). Reuse is judged per token, or per page when ``--page-size`` > 1.
    Starts take minutes on a busy 2-core machine (``start_timeout``), a request up to
    ``timeout`` seconds (default 600); the baseline audit starts
    one fresh server per audited request (``audit=False``: not audited, a partial verdict).
    """
    if cold not in COLD:
        raise EngineError(f"cold={cold!r} is not one of {', '.join(COLD)}")
    model = Path(model_dir)
    config = model_config(model)
    image_token = config.get("image_token_id")
    page = page_size_of(flags)
    cmd = sglang_command(model, flags, python=python, cache_report=cache_report, metrics=metrics)
    cold_cmd = None
    if cold == "server":
        cold_cmd = cmd if "--disable-radix-cache" in flags else [*cmd, "--disable-radix-cache"]
    sources: list[ApiField | MetricDelta] = []
    if cache_report:
        sources.append(ApiField("usage.prompt_tokens_details.cached_tokens"))
    if metrics:
        sources.append(MetricDelta("sglang:cached_tokens_total", unit="tokens"))
    vocab = Vocabulary(model, kind="bytes") if (model / "tokenizer.json").is_file() else None
    engine = OpenAIEngine(
        cmd,
        cold=cold,  # type: ignore[arg-type]
        cold_cmd=cold_cmd,
        model=os.fspath(model),
        top_logprobs=top_logprobs,
        namespace_field="cache_salt",
        reset_paths=SGLANG_RESETS,
        prompt_ids="reply",
        image_token_id=None if image_token is None else int(image_token),
        supports_images=image_token is not None,
        vocab=vocab,
        env=SGLANG_ENV,
        timeout=timeout,
        start_timeout=start_timeout,
        audit=audit,
        fork=False,  # SGLang starts its scheduler and detokenizer processes itself
        claims=ClaimWatch(sources) if sources else None,
        reuse_reference="block" if page > 1 else "token",
        block_size=page if page > 1 else None,
    )
    model_type = str(config.get("model_type", ""))
    atol = engine_atol("sglang", model_type)
    if atol is not None:
        engine.atol = atol
        engine.tolerance_rule = engine_rule("sglang", model_type)
    return engine
