"""One request's way through :class:`~.openai.OpenAIEngine`: its route (the cached server, or
the uncached baseline's: a salt, a reset, a restart), the POST to ``/v1/chat/completions``,
the reply read into an Outcome (logprobs checked, prompt ids, the extension's logits) and,
with the tap, the model's own figures in place of the API's. The servers themselves (started,
reset, audited) are :mod:`.openai`'s."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from typing import TYPE_CHECKING, Any

from ...errors import EngineError
from ...tap.identity_vllm import REQUEST_HEADER
from ...tap.tracks import TapLedger
from ...types import Outcome, Request
from .chat import chat_body
from .claims import Pending
from .engine_settings import EngineSettings
from .prompt_ids import prompt_count
from .prompt_logprobs import read_prompt_logprobs
from .replies import Reply, logprob_problems, parse_reply, stopped_unreported, with_extension
from .server import ServerProcess, connection_problem, http_json
from .tapped import log_tap, tapped_outcome

__all__ = ["RequestPath", "Server"]

Server = ServerProcess | str


class RequestPath(EngineSettings):
    """The request path of :class:`~.openai.OpenAIEngine` (see the module)."""

    model: str | None
    server: Server
    cold_server: Server | None
    supports_images: bool
    extra_body: dict[str, Any]
    sampled_tokens: bool
    tap_disagreements: list[str]
    render_mismatches: list[str]
    _cold_lock: threading.Lock
    _readers: dict[int, TapLedger]
    _clean: set[int]

    if TYPE_CHECKING:

        def _start(self, proc: ServerProcess) -> ServerProcess: ...

        def _reset_or_restart(self, server: Server | None) -> None: ...

    def request_body(self, request: Request) -> dict[str, Any]:
        """Fields of this request's body a subclass adds (they win over every other field):
        llama-server's per-request LoRA scales (:mod:`..llama_slots`). Default: none."""
        return {}

    def run(self, request: Request, *, use_cache: bool) -> Outcome:
        if request.images and not self.supports_images:
            raise EngineError("this server adapter is configured without image support")
        if not use_cache and self.baseline.cold in ("reset", "restart"):
            # a reset (or restart) before each cold request keeps it cold only if no other
            # request is in flight on that server: cold requests go one at a time
            with self._cold_lock:
                return self._run(request, use_cache)
        return self._run(request, use_cache)

    def _run(self, request: Request, use_cache: bool) -> Outcome:
        target, namespace = self._route(request, use_cache)
        claims, tap = self.readout.claims, self.readout.tap
        pending = None if claims is None else claims.start(target, request, tap=tap)
        try:
            return self._served(target, namespace, request, use_cache, pending)
        finally:
            if pending is not None:
                pending.done()

    def _served(
        self,
        target: Server | None,
        namespace: str,
        request: Request,
        use_cache: bool,
        pending: Pending | None,
    ) -> Outcome:
        request = request if pending is None else pending.request  # more decode steps, tapped
        # the tap ties the exchange to the scheduler's rows by this header (vllm-mlx's reply
        # id is drawn after generation) or by the reply's id (mlx_lm.server)
        exchange = uuid.uuid4().hex if self.readout.tap else None
        reply = self._post(target, request, namespace, pending, exchange)
        read, vocab = self.readout, self._vocab
        parsed = parse_reply(reply, vocab)
        if not use_cache and parsed.cached_tokens:
            raise EngineError(
                f"the uncached baseline reported cached_tokens={parsed.cached_tokens}"
            )
        if not read.tap:
            problems = logprob_problems(parsed, request.max_new_tokens, labels=read.check_labels)
            if problems:
                raise EngineError("; ".join(problems))
        out = self._outcome(parsed, reply, request, target)
        if read.tap:
            reply_id = reply.get("id") if isinstance(reply, dict) else None
            ids = tuple(i for i in (exchange, reply_id) if isinstance(i, str))
            out = self._tapped(out, parsed, request, target, use_cache, ids)
        return out if pending is None else pending.finish(out, reply, vocab)

    def _route(self, request: Request, use_cache: bool) -> tuple[Server | None, str]:
        """The server this run goes to and the namespace it carries (a fresh salt for the
        uncached run in ``cold="salt"``); resets or restarts the baseline server first."""
        if request.namespace and not self.supports_namespaces:
            raise EngineError(
                f"request namespace {request.namespace!r} cannot be sent: set namespace_header "
                "or namespace_field to what this server keys its cache on"
            )
        if request.adapter is not None and request.adapter not in self.adapters:
            raise EngineError(
                f"request adapter {request.adapter!r} cannot be sent: the server serves "
                f"{list(self.adapters) or 'none'} (CacheControl.adapters)"
            )
        if use_cache:
            return self.server, request.namespace
        cold = self.baseline.cold
        if cold == "salt":
            return self.server, f"{request.namespace}#prefixcache-cold-{uuid.uuid4().hex}"
        target = self.cold_server
        if cold == "restart" and isinstance(target, ServerProcess):
            if id(target) not in self._clean:
                self._start(target)
        elif cold == "reset":
            self._reset_or_restart(target)
        return target, request.namespace

    def _outcome(
        self, parsed: Reply, reply: Any, request: Request, target: Server | None
    ) -> Outcome:
        steps, tokens = parsed.steps, parsed.tokens[: request.max_new_tokens]
        labels = parsed.labels[: request.max_new_tokens]
        if self.sampled_tokens and labels and None not in labels:
            tokens = tuple(t for t in labels if t is not None)
        out = Outcome(
            top_logprobs=steps[0] if steps and steps[0] else None,
            step_top_logprobs=tuple(steps[: len(tokens)]),
            tokens=tokens,
            cached_tokens=parsed.cached_tokens,
            prompt_tokens=parsed.prompt_tokens,
            # max_tokens is at least 1: a request for none sends no reply back
            text=parsed.text if request.max_new_tokens else "",
            first_token_seconds=parsed.prompt_seconds,
            prompt_logprobs=read_prompt_logprobs(reply) if self.readout.prompt_logprobs else None,
            # without the tap nothing else tells what the first token was
            unreported_stop=not self.readout.tap
            and stopped_unreported(parsed, request.max_new_tokens),
        )
        if self.readout.extensions:
            return with_extension(out, reply, request.max_new_tokens)
        prompt_ids = self._prompt_ids
        if prompt_ids.active:
            base = target.url if isinstance(target, ServerProcess) else str(target)
            try:
                ids, spans = prompt_ids(parsed, request, base, self.process.timeout)
            except EngineError as exc:
                self.render_mismatches.append(str(exc))
                raise
            count = prompt_count(out.prompt_tokens, ids)
            out = dataclasses.replace(out, token_ids=ids, image_spans=spans, prompt_tokens=count)
        return out

    def _tapped(
        self,
        out: Outcome,
        parsed: Reply,
        request: Request,
        target: Server | None,
        use_cache: bool,
        reply_ids: tuple[str, ...],
    ) -> Outcome:
        assert isinstance(target, ServerProcess)
        api = out
        vocab = self._vocab
        out, problems = tapped_outcome(
            self._readers[id(target)],
            out,
            parsed.completion_tokens,
            request.max_new_tokens,
            decode=None if vocab is None else vocab.decode,
            reply_id=reply_ids,
        )
        self.tap_disagreements += problems
        tap_log = self.readout.tap_log
        if tap_log is not None:
            log_tap(tap_log, use_cache=use_cache, api=api, tapped=out, problems=len(problems))
        return out

    def _post(
        self,
        target: Server | None,
        request: Request,
        namespace: str,
        pending: Pending | None = None,
        exchange: str | None = None,
    ) -> Any:
        base = target.url if isinstance(target, ServerProcess) else str(target)
        if isinstance(target, ServerProcess):
            self._clean.discard(id(target))
        read, kv = self.readout, self.cache
        body, headers = chat_body(
            request,
            top_logprobs=read.top_logprobs,
            model=self.model if request.adapter is None else request.adapter,
            namespace=(kv.namespace_field, kv.namespace_header, namespace),
            extra={
                **({"prefixcache": {"logits": True}} if read.extensions else {}),
                **({"return_token_ids": True} if read.prompt_ids == "reply" else {}),
                **({"prompt_logprobs": read.prompt_logprobs} if read.prompt_logprobs else {}),
                **self.extra_body,
                **self.request_body(request),
            },
        )
        if exchange is not None:
            headers = {**headers, REQUEST_HEADER: exchange}
        ledger = self._readers.get(id(target)) if isinstance(target, ServerProcess) else None
        try:
            status, reply = http_json(
                "POST",
                base + "/v1/chat/completions",
                body,
                headers=headers,
                timeout=self.process.timeout,
                response_headers=None if pending is None else pending.headers,
            )
        except OSError as exc:
            if ledger is not None:
                ledger.count_unanswered()
            proc = target if isinstance(target, ServerProcess) else None
            raise EngineError(
                f"POST {base}/v1/chat/completions: {connection_problem(exc, base, proc)}"
            ) from exc
        if ledger is not None:  # counted once the reply is in: a refusal ran no prefill
            (ledger.count_sent if status == 200 else ledger.count_unanswered)()
        if status != 200:
            log = target.log_note() if isinstance(target, ServerProcess) else ""
            raise EngineError(
                f"{base}/v1/chat/completions answered {status}: {str(reply)[:500]}{log}"
            )
        return reply
