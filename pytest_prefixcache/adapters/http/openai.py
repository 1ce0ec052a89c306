"""Any OpenAI-compatible chat server behind the Engine protocol (stdlib HTTP, no SDK).

Requests go to ``/v1/chat/completions`` with images as PNG data URLs, greedy decoding,
``logprobs``, ``top_logprobs`` and any ``extra_body`` fields. The reply gives
``Outcome.top_logprobs`` and ``step_top_logprobs`` (token id -> logprob at every decode step,
compared cached vs uncached at every step), ``tokens`` (the argmax of each step, sorted here),
``cached_tokens`` from ``usage.prompt_tokens_details`` and ``prompt_tokens``. Missing, short or
shifted logprobs, and entries that name no token id, are an EngineError naming the decode step
and what came back (see :func:`.replies.logprob_problems`). Prompt token ids come from the
server or a local render (:mod:`.prompt_ids`).

The uncached baseline (``cold=``, default ``"reset"``) is described in :mod:`.baselines`.

Every uncached reply that reports ``cached_tokens > 0`` raises EngineError. The baseline
audit checks the chosen baseline: :meth:`OpenAIEngine.fresh_instance` starts a new server for
each audited request (:mod:`.fresh`: for ``{python} -m MODULE`` commands every server is
forked from a process that has imported MODULE, and the audit's next one started ahead). With
``tap=True`` every server started here runs under the logit tap
(the command must start ``python -m pytest_prefixcache.tap``) and the Outcome gets the real
full-vocabulary ``logits`` and ``step_logits``; ``tap_disagreements`` lists every reply whose
API figures the tap contradicts.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Mapping
from typing import Any

from ...errors import EngineError
from ...tap.tracks import TapLedger
from ...types import Outcome
from .baselines import check_baseline
from .config import Baseline, CacheControl, Command, Process, Readout, grouped
from .fresh import Forks, FreshServers
from .request_path import RequestPath, Server
from .resets import reset_caches
from .server import ServerProcess, remove_quietly
from .tapped import attach_tap

__all__ = ["OpenAIEngine"]


class OpenAIEngine(RequestPath):
    """An OpenAI-compatible server, started here (``cmd``) or reached at ``url``.

    Args:
        cmd: server command line with ``{port}``; or ``url`` of a running server.
        model: the ``model`` field sent, if any. Default: None.
        baseline: how the uncached baseline is made and audited (:class:`.config.Baseline`:
            ``cold``, ``cold_cmd``, ``cold_url``, ``audit``, ``fork``).
        cache: what the server's cache answers to (:class:`.config.CacheControl`: namespaces,
            reset endpoints, ``reuse_reference``, ``block_size``, ``warm_start``).
        readout: what is read from replies and from the model (:class:`.config.Readout`:
            ``top_logprobs``, ``check_labels``, ``tap``, ``claims``, prompt ids, ``vocab``).
        process: the servers started here (:class:`.config.Process`: ``env``, ``timeout``,
            ``start_timeout``, ``health_path``).
        supports_images: whether to send image requests. Default: ``True``.
        extra_body: fields added to every request body (they win over the adapter's own).
        atol: the tolerance this server's cold and warm runs need (a preset's measured rule);
            the plugin judges by it unless a tolerance option (``--prefixcache-atol``,
            ``--prefixcache-rtol``, ``--prefixcache-kl``) is given. Default: exact.
        concurrency: requests the server serves at once: above 1, ``run`` may be called
            from that many threads (the plugin's waves property sends concurrent requests).
            The tap follows each request's batch rows (:mod:`pytest_prefixcache.tap.tracks`)
            and gives the served order; claim sources read around a request (stats,
            metrics, logs) claim nothing for a request that had another in flight on its
            server (the API's and headers' figures are per request). With ``cold="reset"``
            or ``"restart"`` the cold requests still go one at a time (the waves' noise
            control is then not concurrent: use ``cold="server"`` or ``"salt"`` for one
            that is). Default: ``1``.
        **fields: any field of the four groups by name, instead of its group:
            ``OpenAIEngine(cmd, cold="server", tap=True)``.
    """

    # traits a preset adjusts (pytest_prefixcache.traits.EngineTraits documents them)
    caches_output: bool = False
    cache_capacity_tokens: int | None = None
    batch_invariant: bool = False

    #: The verdict's advice for checks that could not run names the PREFIXCACHE_* settings.
    coverage_hints = "server"

    def __init__(
        self,
        cmd: Command | None = None,
        *,
        url: str | None = None,
        model: str | None = None,
        baseline: Baseline | None = None,
        cache: CacheControl | None = None,
        readout: Readout | None = None,
        process: Process | None = None,
        supports_images: bool = True,
        extra_body: Mapping[str, Any] | None = None,
        atol: float = 0.0,
        concurrency: int = 1,
        **fields: Any,
    ) -> None:
        groups = grouped(
            {"baseline": baseline, "cache": cache, "readout": readout, "process": process},
            fields,
        )
        base: Baseline = groups["baseline"]
        read: Readout = groups["readout"]  # a vocab directory is read when the group is made
        #: The settings, each in its group only (:mod:`.config`); a copy that changes one
        #: replaces its group: ``dataclasses.replace(engine.readout, top_logprobs=5)``.
        self.baseline: Baseline = base
        self.cache: CacheControl = groups["cache"]
        self.readout: Readout = read
        self.process: Process = groups["process"]
        check_baseline(
            cmd=cmd,
            url=url,
            cold=base.cold,
            cold_cmd=base.cold_cmd,
            cold_url=base.cold_url,
            salted=self.supports_namespaces,
            tap=read.tap,
        )
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise EngineError(f"concurrency={concurrency!r} is not an int >= 1")
        #: Requests the plugin may send at once (its waves property); 1: one at a time.
        self.max_concurrency = concurrency
        self._cold_lock = threading.Lock()  # cold="reset"/"restart": one cold request at a time
        self._fresh_lock = threading.Lock()  # the audit's fresh servers, made once (parallel lanes)
        self.atol = atol
        #: How the report names ``atol`` when a preset set it from a measured rule.
        self.tolerance_rule = ""
        self.model = model
        _ = self.resets, self._prompt_ids  # refused now, not at the first reset or reply
        self.supports_images = supports_images
        self.extra_body = dict(extra_body or {})
        #: The Outcome's tokens are the ids each step's own entry names (the sampled tokens)
        #: instead of each step's argmax: for a server whose own ids are right while sampling
        #: is constrained (llama-server with a grammar), so that the reply's tokens, which the
        #: next closed-loop prompt carries, are the ones the oracle counts. Default: False.
        self.sampled_tokens = False
        self.tap_disagreements: list[str] = []
        self.render_mismatches: list[str] = []
        self._readers: dict[int, TapLedger] = {}
        self._clean: set[int] = set()  # servers started and not sent a request since
        self._fresh_cmd = (base.cold_cmd or cmd) if base.cold != "salt" else cmd
        self._forks = Forks(
            fork=base.fork, env=self.process.env, start_timeout=self.process.start_timeout
        )
        self._fresh: FreshServers | None = None  # built on first use; the copies share it
        self._owner = True  # fresh instances (copies) leave the shared servers alone
        #: The baseline audit starts a new server per audited request (fresh_instance).
        self.supports_fresh_instances = base.audit and self._fresh_cmd is not None
        #: Audited requests one fresh server may answer (the audit keeps them from sharing
        #: anything it could carry); set by the presets of slow servers.
        self.fresh_instance_share = 1
        self.fresh_instances_missing = (
            "a server given by URL: no fresh server can be started"
            if base.audit
            else "the audit's fresh servers are switched off (audit=False, PREFIXCACHE_AUDIT=0)"
        )
        #: Restarts of the cold server that stood in for a reset (it has no reset endpoint).
        self.restarts_for_cold = 0
        #: Its command keeps a cache that outlives the server (a storage path; set it when the
        #: command has one): the restart streams then restart it (:meth:`restart`).
        self.persists = False
        self.server: Server = ""
        self.cold_server: Server | None = None
        cold_cmd, cold_url = base.cold_cmd, base.cold_url
        try:
            self.server = self._make(cmd, url)
            if base.cold != "salt":
                self.cold_server = self._make(cold_cmd if cold_cmd or cold_url else cmd, cold_url)
        except BaseException:  # what did start (a server, a fork server) goes now, not at exit
            self.close()
            raise

    def _make(self, cmd: Command | None, url: str | None) -> Server:
        return str(url).rstrip("/") if cmd is None else self._start(self._process(cmd))

    def _process(self, cmd: Command) -> ServerProcess:
        settings = self.process
        proc = ServerProcess(
            cmd,
            env=settings.env,
            forker=self._forks.get(cmd),
            health_path=settings.health_path,
            start_timeout=settings.start_timeout,
        )
        if self.readout.tap:  # one append-only records file per server, kept across its restarts
            self._readers[id(proc)] = attach_tap(proc, self)
        return proc

    def _start(self, proc: ServerProcess) -> ServerProcess:
        proc.start()
        if not self.cache.warm_start:
            self._clean.add(id(proc))
        ledger = self._readers.get(id(proc))
        if ledger is not None:  # what it computed while starting is its warm-up
            ledger.started()
        return proc

    def warmup_prompts(self) -> list[tuple[int, ...]]:
        """The prompts the cached server ran on its own at its latest start (its warm-up,
        read by the tap), unless a reset endpoint emptied its cache since: earlier requests
        for the token oracle (rapid-mlx 0.12 sends 'Hi' through its prefix cache at start)."""
        ledger = self._readers.get(id(self.server))
        return [] if ledger is None else ledger.warmup_prompts()

    def kv_computed(self, out: Outcome) -> int | None:
        """How many KV positions the cached server's model computed for the request ``out``
        answered (a ``use_cache=True`` Outcome of this engine): its rows in the tap's records,
        read now, so that a row written after the reply counts (the decode-KV probe asks
        after the next request). None without the tap."""
        ledger = self._readers.get(id(self.server))
        if ledger is None or out.served is None:
            return None
        return ledger.kv_end(out.served)

    def request_count_problems(self) -> list[str]:
        """With the tap: every server started here whose model ran fewer prefills than the
        requests it answered (a reply served without the model, one computation answering two
        requests) or more than those and the requests it left unanswered together (another
        client on its port); call it with no request in flight. A request refused with an
        error status (oMLX's 503 when its memory gate closes) ran nothing: it is not counted
        as answered (:meth:`.TapLedger.count_unanswered`)."""
        out = []
        for s in (self.server, self.cold_server):
            if not isinstance(s, ServerProcess) or id(s) not in self._readers:
                continue
            problem = self._readers[id(s)].count_problem()
            if problem:
                out.append(f"{s.url} {problem}")
        return out

    @property
    def uncached_times_skewed(self) -> str:
        """Why an uncached run's time is not a cold prefill's ('' when it is): with
        ``cold="restart"``, or a reset that fell back to restarts, every uncached run starts a
        server first, so no warm/cold speedup is computed from them."""
        if self.baseline.cold == "restart":
            return "the uncached runs restart a server (cold='restart')"
        if self.restarts_for_cold:
            return "the uncached runs restart a server: it has no cache reset endpoint"
        return ""

    @property
    def cold_waves_serial(self) -> str:
        """Why the uncached runs of a wave go one at a time ('' when they are sent together):
        a reset or a restart before each keeps it cold only with nothing else in flight."""
        cold = self.baseline.cold
        return (
            f"cold={cold!r} resets before each uncached run" if cold in ("reset", "restart") else ""
        )

    def fresh_instance(self) -> OpenAIEngine:
        """An engine whose every run goes, uncached, to a server started just for it from
        the baseline's command; ``close()`` stops it. The baseline audit calls this."""
        cmd = self._fresh_cmd
        if cmd is None:
            raise EngineError(self.fresh_instances_missing)
        with self._fresh_lock:  # parallel streams audit from several threads
            if self._fresh is None:
                forked = self._forks.get(cmd) is not None
                self._fresh = FreshServers(lambda: self._process(cmd).start(), ahead=forked)
        fresh = copy.copy(self)
        fresh.tap_disagreements, fresh.render_mismatches, fresh._clean = [], [], set()
        fresh._owner = False
        fresh.server = fresh.cold_server = self._fresh.take()
        fresh.baseline = dataclasses.replace(self.baseline, cold="server")
        return fresh

    # -- the protocol -----------------------------------------------------------------------
    def close(self) -> None:
        """Stop every server started here."""
        for s in (self.server, self.cold_server):
            if isinstance(s, ServerProcess):
                s.stop()
                remove_quietly(s.extra_env.get("PREFIXCACHE_TAP", ""))
        if self._owner:
            if self._fresh is not None:
                self._fresh.close()
                self._fresh = None
            self._forks.close()

    def __enter__(self) -> OpenAIEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """Empty the cached server's caches: every reset endpoint, else a restart."""
        self._reset_or_restart(self.server)

    def restart(self, changed: str | None = None) -> None:
        """Stop the cached server and start it again with the same command and environment
        (its storage path with them): the restart streams' move. Nothing can be changed."""
        proc = self.server
        if changed is not None or not isinstance(proc, ServerProcess):
            raise EngineError(
                f"restart(changed={changed!r}): "
                + ("a server given by URL cannot be restarted" if changed is None
                   else "a server restarts only with its own command (nothing changed)")
            )  # fmt: skip
        proc.stop()
        self._start(proc)

    def _reset_or_restart(self, server: Server | None) -> None:
        proc = server if isinstance(server, ServerProcess) else None
        if proc is not None and id(proc) in self._clean:
            return  # started and not used since: nothing to empty
        base = proc.url if proc is not None else str(server)
        try:
            done = reset_caches(
                base,
                self.resets,
                self.process.timeout,
                can_restart=proc is not None,
                tolerated=self.cache.reset_tolerated,
            )
        except EngineError as exc:
            raise EngineError(f"{exc}{proc.log_note() if proc else ''}") from None
        ledger = self._readers.get(id(proc)) if done and proc is not None else None
        if ledger is not None:  # an endpoint emptied the cache: the warm-up's KV with it
            ledger.warm = []
        if not done:
            assert proc is not None
            self.restarts_for_cold += proc is self.cold_server
            self._start(proc)
