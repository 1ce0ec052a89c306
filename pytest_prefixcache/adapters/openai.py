"""Any OpenAI-compatible chat server behind the Engine protocol (stdlib HTTP, no SDK).

Requests go to ``/v1/chat/completions`` with images as PNG data URLs, greedy decoding,
``logprobs`` and ``top_logprobs``. The reply gives ``Outcome.top_logprobs`` (token id ->
logprob of the first generated token), ``tokens`` (the argmax of each step's top_logprobs,
sorted here: mlx-lm 0.32.2 reports an unsorted top-k and labels each step with its first
element, so ``content[i].id`` is never trusted), ``cached_tokens`` from
``usage.prompt_tokens_details`` and ``prompt_tokens``.

The uncached baseline (``cold=``):

- ``"restart"``: a second server (``cold_cmd``, default ``cmd``) restarted before every
  uncached request, in a fresh HOME: cold by construction, slow.
- ``"reset"``: a second server, ``POST reset_path`` before every uncached request.
- ``"server"``: a second server that keeps no cache (e.g. ``--prompt-cache-size 0``).
- ``"salt"``: the same server, with a fresh random namespace header (``namespace_header``).

Every uncached reply that reports ``cached_tokens > 0`` raises EngineError. With ``tap=True``
every server started here runs under ``python -m pytest_prefixcache.tap`` semantics (the
command must start the launcher; ``$PREFIXCACHE_TAP`` is set per server) and the Outcome gets
the real full-vocabulary ``logits`` and ``step_logits`` plus the really prefilled count;
``tap_disagreements`` lists every reply whose API figures the tap contradicts.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from ..errors import EngineError
from ..types import Outcome, Request
from .chat import openai_messages
from .claims import ClaimWatch, Pending
from .replies import Vocabulary, parse_reply, with_extension
from .server import ServerProcess, connection_problem, http_json, remove_quietly
from .tapped import apply_tap, log_tap

__all__ = ["OpenAIEngine"]

Cold = Literal["restart", "reset", "server", "salt"]
Command = Sequence[str] | str
Spans = tuple[tuple[int, int, str], ...]


class OpenAIEngine:
    """An OpenAI-compatible server, started here (``cmd``) or reached at ``url``.

    Args:
        cmd: server command line with ``{port}``; or ``url`` of a running server.
        cold: how the uncached baseline is made (see the module docstring). Default:
            ``"restart"``.
        cold_cmd / cold_url: the baseline server (default: another ``cmd``).
        model: the ``model`` field sent, if any. Default: None.
        top_logprobs: k requested per step. Default: ``10`` (mlx-lm allows at most 11).
        namespace_header: header carrying ``Request.namespace``; without one, requests with
            a namespace are refused. Default: None.
        reset_path: the cache-reset endpoint. Default: ``"/v1/cache/reset"``.
        reset_method: its HTTP method (vllm-mlx: ``DELETE /v1/cache``). Default: ``"POST"``.
        health_path: the readiness endpoint. Default: ``"/health"``.
        supports_images: whether to send image requests. Default: ``True``.
        tap: read the logit tap of every server started here. Default: ``False``.
        vocab: a model directory whose tokenizer.json names the ids of top_logprobs entries
            that carry no ``id``. Default: None.
        extensions: ask for reference_engine.server's ``prefixcache`` reply object (token ids,
            image spans, merges, full logits). Default: ``False``.
        render: renders a request to (token ids, image spans) locally (see :mod:`.render`);
            they fill the Outcome when their length is the reply's prompt_tokens, else the
            request is listed in ``render_mismatches``. Default: None.
        timeout: seconds per HTTP request. Default: ``120``.
        start_timeout: seconds for a server to become ready. Default: ``120``.
        env: extra environment for started servers.
        tap_log: with ``tap``, a JSON-lines file that gets, per request, the prompt length, the
            reuse the API reported and the reuse the tap saw (see :func:`.tapped.log_tap`).
            Default: None.
        claims: the claim sources read around every request (see :mod:`.claims`); with
            ``tap``, their figures and the API's per-step logprobs are compared with what the
            model computed (the claims check). Default: None.
    """

    #: The baseline audit would start a new server per audited request: too slow to do by
    #: default, so a server's cold baseline (``cold``) is reported as not audited.
    supports_fresh_instances = False
    fresh_instances_missing = "a fresh instance would be a new server per request"

    def __init__(
        self,
        cmd: Command | None = None,
        *,
        url: str | None = None,
        cold: Cold = "restart",
        cold_cmd: Command | None = None,
        cold_url: str | None = None,
        model: str | None = None,
        top_logprobs: int = 10,
        namespace_header: str | None = None,
        reset_path: str = "/v1/cache/reset",
        reset_method: str = "POST",
        health_path: str = "/health",
        supports_images: bool = True,
        tap: bool = False,
        timeout: float = 120.0,
        start_timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
        vocab: str | os.PathLike[str] | None = None,
        extensions: bool = False,
        render: Callable[[Request], tuple[list[int], Spans]] | None = None,
        tap_log: str | os.PathLike[str] | None = None,
        claims: ClaimWatch | None = None,
    ) -> None:
        if (cmd is None) == (url is None):
            raise EngineError("give exactly one of cmd (a server command line) or url")
        if cold not in ("restart", "reset", "server", "salt"):
            raise EngineError(f"cold={cold!r} is not 'restart', 'reset', 'server' or 'salt'")
        if cold == "salt" and namespace_header is None:
            raise EngineError("cold='salt' needs namespace_header (the header the salt goes in)")
        if cold == "restart" and cmd is None and cold_cmd is None:
            raise EngineError("cold='restart' needs cmd or cold_cmd (a server it can restart)")
        if tap and (cmd is None or (cold != "salt" and cold_url is not None)):
            raise EngineError("tap=True needs servers started here (cmd, cold_cmd)")
        self.cold = cold
        self.model = model
        self.top_logprobs = top_logprobs
        self.namespace_header = namespace_header
        self.supports_namespaces = namespace_header is not None
        self.reset_path = reset_path
        self.reset_method = reset_method
        self.supports_images = supports_images
        self.tap = tap
        self.tap_log = tap_log
        self.claims = claims
        self.timeout = timeout
        self.tap_disagreements: list[str] = []
        self.vocab = Vocabulary(vocab) if vocab is not None else None
        self.extensions = extensions
        self.render = render
        self.render_mismatches: list[str] = []
        self._readers: dict[int, Any] = {}
        opts: dict[str, Any] = {"health_path": health_path, "start_timeout": start_timeout}
        self._env = dict(env or {})
        self.server = self._make(cmd, url, opts)
        self.cold_server: ServerProcess | str | None = None
        if cold != "salt":
            self.cold_server = self._make(cold_cmd if cold_cmd or cold_url else cmd, cold_url, opts)

    def _make(
        self, cmd: Command | None, url: str | None, opts: dict[str, Any]
    ) -> ServerProcess | str:
        if cmd is None:
            return str(url).rstrip("/")
        proc = ServerProcess(cmd, env=self._env, **opts)
        if self.tap:  # one append-only records file per server, kept across its restarts
            from ..tap import ENV, TapReader

            path = os.path.join(tempfile.gettempdir(), f"prefixcache-tap-{uuid.uuid4().hex}")
            proc.extra_env[ENV] = path
            self._readers[id(proc)] = TapReader(path)
            weakref.finalize(self, remove_quietly, path)  # also when never closed
        return proc.start()

    # -- the protocol -----------------------------------------------------------------------
    def close(self) -> None:
        """Stop every server started here."""
        for s in (self.server, self.cold_server):
            if isinstance(s, ServerProcess):
                s.stop()
                remove_quietly(s.extra_env.get("PREFIXCACHE_TAP", ""))

    def __enter__(self) -> OpenAIEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """Empty the cached server's cache: the reset endpoint, else a restart."""
        self._reset_or_restart(self.server)

    def _reset_or_restart(self, server: ServerProcess | str | None) -> None:
        base = server.url if isinstance(server, ServerProcess) else str(server)
        proc = server if isinstance(server, ServerProcess) else None
        try:
            status, reply = http_json(
                self.reset_method, base + self.reset_path, {}, timeout=self.timeout
            )
        except OSError as exc:
            if proc is None:
                raise EngineError(
                    f"cannot reset {base}: {self.reset_method} {self.reset_path}: "
                    f"{connection_problem(exc, base)}"
                ) from exc
            status, reply = None, None
        if status == 200:  # trusted: a reset that keeps reuse shows as a reuse-bound failure
            return
        if proc is None:
            reply_text = str(reply)[:300]
            raise EngineError(f"{base}{self.reset_path} answered {status}: {reply_text}")
        proc.start()  # no reset endpoint, or a dead server: a restart empties the cache

    def run(self, request: Request, *, use_cache: bool) -> Outcome:
        if request.images and not self.supports_images:
            raise EngineError("this server adapter is configured without image support")
        headers: dict[str, str] = {}
        if request.namespace:
            if self.namespace_header is None:
                raise EngineError(
                    f"request namespace {request.namespace!r} cannot be sent: set "
                    "namespace_header to the header this server keys its cache on"
                )
            headers[self.namespace_header] = request.namespace
        target = self.server
        if not use_cache:
            if self.cold == "salt":
                assert self.namespace_header is not None
                salt = f"{request.namespace}#prefixcache-cold-{uuid.uuid4().hex}"
                headers[self.namespace_header] = salt
            else:
                assert self.cold_server is not None
                target = self.cold_server
                if self.cold == "restart":
                    assert isinstance(target, ServerProcess)
                    target.start()
                elif self.cold == "reset":
                    self._reset_or_restart(target)
        pending = None if self.claims is None else self.claims.start(target, request, tap=self.tap)
        request = request if pending is None else pending.request  # more decode steps, tapped
        reply = self._post(target, request, headers, pending)
        parsed = parse_reply(reply, self.vocab)
        steps, cached, prompt = parsed.steps, parsed.cached_tokens, parsed.prompt_tokens
        if not use_cache and cached:
            raise EngineError(f"the uncached baseline reported cached_tokens={cached}")
        tokens = parsed.tokens
        if not self.tap and (not steps or len(tokens) < len(steps)):
            raise EngineError(
                "the reply's top_logprobs do not name every greedy token id (no top_logprobs, "
                f"or entries without ids: pass vocab=, or use tap=True): {str(reply)[:300]}"
            )
        out = Outcome(
            top_logprobs=steps[0] if steps and steps[0] else None,
            tokens=tokens[: request.max_new_tokens],
            cached_tokens=cached,
            prompt_tokens=prompt,
        )
        if self.extensions:
            out = with_extension(out, reply, request.max_new_tokens)
        elif self.render is not None:
            ids, spans = self.render(request)
            if prompt is None or len(ids) == prompt:
                out = dataclasses.replace(out, token_ids=tuple(ids), image_spans=spans)
            else:
                self.render_mismatches.append(f"rendered {len(ids)} tokens, server {prompt}")
        if self.tap:
            assert isinstance(target, ServerProcess)
            # usage.completion_tokens can overcount (vllm-mlx 0.6.0 re-encodes the text)
            expected = min(parsed.completion_tokens, max(1, request.max_new_tokens))
            api = out
            out, problems = apply_tap(
                self._readers[id(target)], out, expected, request.max_new_tokens
            )
            self.tap_disagreements += problems
            if self.tap_log is not None:
                log_tap(
                    self.tap_log, use_cache=use_cache, api=api, tapped=out, problems=len(problems)
                )
        return out if pending is None else pending.finish(out, reply, self.vocab)

    def _post(
        self,
        target: ServerProcess | str | None,
        request: Request,
        headers: dict[str, str],
        pending: Pending | None = None,
    ) -> Any:
        base = target.url if isinstance(target, ServerProcess) else str(target)
        body: dict[str, Any] = {
            "messages": openai_messages(request),
            "max_tokens": max(1, request.max_new_tokens),
            "temperature": 0.0,
            "logprobs": True,
            "top_logprobs": self.top_logprobs,
            "stream": False,
        }
        if self.model is not None:
            body["model"] = self.model
        if self.extensions:
            body["prefixcache"] = {"logits": True}
        try:
            status, reply = http_json(
                "POST", base + "/v1/chat/completions", body, headers=headers, timeout=self.timeout,
                response_headers=None if pending is None else pending.headers,
            )  # fmt: skip
        except OSError as exc:
            proc = target if isinstance(target, ServerProcess) else None
            raise EngineError(
                f"POST {base}/v1/chat/completions: {connection_problem(exc, base, proc)}"
            ) from exc
        if status != 200:
            raise EngineError(f"{base}/v1/chat/completions answered {status}: {str(reply)[:500]}")
        return reply
