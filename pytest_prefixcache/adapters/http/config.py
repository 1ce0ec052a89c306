"""What :class:`.openai.OpenAIEngine` is told, in four groups.

- :class:`Baseline`: how the uncached baseline is made and audited (``cold``, the second
  server, the audit's fresh servers, forking);
- :class:`CacheControl`: what the server's cache answers to (namespaces, reset endpoints, what
  it can reuse by design, whether it warms itself at start);
- :class:`Readout`: what is read from replies and from the model (top_logprobs, labels, the
  logit tap, claims, prompt token ids, the reference server's extension);
- :class:`Process`: the servers started here (environment, timeouts, readiness endpoint).

Every field can also be given to ``OpenAIEngine`` by name (``OpenAIEngine(cmd, cold="server")``
is ``OpenAIEngine(cmd, baseline=Baseline(cold="server"))``); :func:`grouped` sorts such names
into their groups and refuses a name no group has, or a field given both ways.

The groups are each field's only home: the engine reads ``engine.readout.top_logprobs`` and keeps
no copy (it refuses ``engine.top_logprobs = 5``); a changed setting is a replaced group,
``engine.readout = dataclasses.replace(engine.readout, top_logprobs=5)``, as the audit's fresh
copies do with ``cold``. :data:`FIELDS` names each field's group.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import EngineError
from ..environment import START_TIMEOUT
from .baselines import Cold

if TYPE_CHECKING:
    from ...types import Request
    from .claims import ClaimWatch
    from .prompt_ids import Source, Spans
    from .replies import Vocabulary

__all__ = ["FIELDS", "Baseline", "CacheControl", "Command", "Process", "Readout", "grouped"]

Command = Sequence[str] | str


@dataclass(frozen=True)
class Baseline:
    """How the uncached baseline is made (:mod:`.baselines`) and audited.

    Attributes:
        cold: ``"reset"`` (default), ``"restart"``, ``"server"`` or ``"salt"``.
        cold_cmd / cold_url: the baseline server (default: another ``cmd``).
        audit: let the baseline audit start a fresh server per audited request (off: the
            coverage table says the baseline was not audited). Default: ``True``.
        fork: fork the servers from a process that has imported the command's module, and
            start the audit's next fresh server ahead (``{python} -m MODULE`` commands; see
            :mod:`.fresh`). Default: None (on Linux; not on macOS, where a process that has
            imported MLX is not safe to fork).
    """

    cold: Cold = "reset"
    cold_cmd: Command | None = None
    cold_url: str | None = None
    audit: bool = True
    fork: bool | None = None


@dataclass(frozen=True)
class CacheControl:
    """What the server's cache answers to.

    Attributes:
        namespace_header / namespace_field: the header and/or body field carrying
            ``Request.namespace`` (vLLM: ``namespace_field="cache_salt"``); with neither,
            requests with a namespace are refused.
        reset_paths: the cache-reset endpoints, ``"METHOD /path"`` each (a sequence or a
            comma-separated string). Default: ``reset_method reset_path``
            (``POST /v1/cache/reset``).
        reset_tolerated: the ``error`` texts a reset reply may carry and still count as a reset.
        reuse_reference / block_size: what the server's cache can reuse by design, the
            reference its efficiency and positive control are judged against: ``"token"``,
            ``"snapshot"`` (hybrid or sliding-window models: it resumes only at snapshots) or
            ``"block"`` (whole blocks of ``block_size`` only). Default: ``"token"``.
        warm_start: the server fills its own cache while it starts (rapid-mlx 0.16.10 sends a
            whole request through its prefix cache to warm up hybrid and sliding-window
            models), so a server just started is reset too before its first stream.
        adapters: the LoRA adapter names the server (and its cold server) serves; a request
            with ``Request.adapter`` sends it as the body's ``model`` (vLLM's
            ``--lora-modules NAME=PATH``, the reference server's ``--adapter NAME=DIR``).
            Empty: the streams send none.
    """

    namespace_header: str | None = None
    namespace_field: str | None = None
    reset_path: str = "/v1/cache/reset"
    reset_method: str = "POST"
    reset_paths: Sequence[str] | str | None = None
    reset_tolerated: Sequence[str] = ()
    reuse_reference: str = "token"
    block_size: int | None = None
    warm_start: bool = False
    adapters: Sequence[str] = ()


@dataclass(frozen=True)
class Readout:
    """What is read from the replies and from the model.

    Attributes:
        top_logprobs: k requested per step. Default: ``10`` (mlx-lm allows at most 11).
        check_labels: check each step's own token against its top_logprobs (off for servers
            that mislabel steps, like mlx-lm 0.32.2). Default: ``True``.
        tap: read the logit tap of every server started here (the command must start
            ``python -m pytest_prefixcache.tap``): the real full-vocabulary logits.
        tap_log: with ``tap``, a JSON-lines file of the API's and the tap's reuse per request.
        claims: the claim sources read around every request (see :mod:`.claims`); with
            ``tap``, their figures and the API's per-step logprobs are compared with what the
            model computed (the claims check).
        vocab: a model directory whose tokenizer.json names the ids of top_logprobs entries
            that carry no ``id`` (decoded text), read into a :class:`.replies.Vocabulary` when
            the group is made, or a Vocabulary of another kind (SGLang: ``kind="bytes"``).
        prompt_ids: where the server says the prompt's token ids: ``"reply"`` (vLLM; asks for
            ``return_token_ids``), ``"tokenize"`` (llama-server's ``/tokenize``), or None.
        image_token_id: the image placeholder id, for image spans in server-side ids.
        render: renders a request to (token ids, image spans) locally (see :mod:`.render`);
            checked against the server's ids and ``usage.prompt_tokens``.
        extensions: ask for reference_engine.server's ``prefixcache`` reply object (token ids,
            image spans, merges, message starts, full logits).
        prompt_logprobs: K > 0 asks for vLLM's ``prompt_logprobs`` (the top K at every prompt
            position) and reads them into ``Outcome.prompt_logprobs``; the engine then
            declares ``returns_prompt_logprobs``. Default: ``0`` (not asked).
    """

    top_logprobs: int = 10
    check_labels: bool = True
    tap: bool = False
    tap_log: str | os.PathLike[str] | None = None
    claims: ClaimWatch | None = None
    vocab: str | os.PathLike[str] | Vocabulary | None = None
    prompt_ids: Source | None = None
    image_token_id: int | None = None
    render: Callable[[Request], tuple[list[int], Spans]] | None = None
    extensions: bool = False
    prompt_logprobs: int = 0

    def __post_init__(self) -> None:
        k = self.prompt_logprobs
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise EngineError(f"prompt_logprobs={k!r} is not an int >= 0 (top K per position)")
        if isinstance(self.vocab, (str, os.PathLike)):  # read once, not at every reply
            from .replies import Vocabulary

            object.__setattr__(self, "vocab", Vocabulary(self.vocab))


@dataclass(frozen=True)
class Process:
    """The servers started here.

    Attributes:
        env: extra environment for started servers (``{home}`` is the server's private HOME).
        timeout: seconds per HTTP request. Default: ``120``.
        start_timeout: seconds for a server to become ready (every retry included).
        health_path: the readiness endpoint. Default: ``"/health"``.
    """

    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 120.0
    start_timeout: float = START_TIMEOUT
    health_path: str = "/health"


GROUPS: dict[str, type] = {
    "baseline": Baseline,
    "cache": CacheControl,
    "readout": Readout,
    "process": Process,
}

#: Every field of the four groups -> the key of the group that holds it (``"cold"`` ->
#: ``"baseline"``): the engine keeps each in its group only.
FIELDS: dict[str, str] = {
    f.name: key for key, cls in GROUPS.items() for f in dataclasses.fields(cls)
}


def grouped(given: Mapping[str, Any | None], fields: Mapping[str, Any]) -> dict[str, Any]:
    """The four groups, from the groups ``given`` by keyword (None: not given) and the
    ``fields`` given by name; a name no group has, or a field given both in its group and by
    name, is a TypeError naming it."""
    by_group: dict[str, dict[str, Any]] = {key: {} for key in GROUPS}
    for name, value in fields.items():
        if name not in FIELDS:
            near = difflib.get_close_matches(name, list(FIELDS) + list(GROUPS), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise TypeError(f"OpenAIEngine() got an unexpected keyword argument {name!r}{hint}")
        by_group[FIELDS[name]][name] = value
    out: dict[str, Any] = {}
    for key, cls in GROUPS.items():
        group = given.get(key)
        if group is not None and not isinstance(group, cls):
            raise TypeError(f"OpenAIEngine({key}=...) takes a {cls.__name__}, not {group!r}")
        if group is not None and by_group[key]:
            both = ", ".join(sorted(by_group[key]))
            raise TypeError(f"OpenAIEngine() got {both} both by name and in {key}={group!r}")
        out[key] = group if group is not None else cls(**by_group[key])
    return out
