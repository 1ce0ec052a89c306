"""Every environment variable the adapters read, declared once: its name, what it does, its
default and how its value is parsed. The presets' ``from_env`` functions read them through
:func:`value`, and docs/adapters.md's table of them is :func:`markdown_table`
(``python -m pytest_prefixcache.adapters.environment`` prints it; tests/test_environment.py
fails when the page drifts from this declaration, defaults included). Below the presets
(``presets``, ``omlx``, ``seed``), so that each imports them without importing another preset."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import EngineError

__all__ = [
    "START_TIMEOUT",
    "VARIABLES",
    "Variable",
    "audit_share",
    "batch_invariant_from_env",
    "concurrency_from_env",
    "markdown_table",
    "value",
]

#: Seconds for a server's whole start, until its health endpoint answers: every adapter's
#: default, unless its engine declares its own beside its preset (``seed.START_TIMEOUT``, ...).
START_TIMEOUT = 180.0


def _switch(raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError("is not 0 or 1")
    return raw == "1"


def _at_least_one(raw: str) -> int:
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ValueError("is not an integer >= 1")
    return int(raw)


def _seconds(raw: str) -> float:
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError("is not a number of seconds above 0")
    return seconds


def _json_object(raw: str) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"is not JSON ({exc.msg})") from None
    if not isinstance(parsed, dict):
        raise ValueError("is not a JSON object")
    return parsed


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in choices:
            raise ValueError(f"is not one of {', '.join(choices)}")
        return raw

    return parse


def _text(raw: str) -> str:
    return raw


@dataclass(frozen=True)
class Variable:
    """One environment variable.

    Attributes:
        name: the variable (``PREFIXCACHE_COLD``).
        doc: what it does, in Markdown (one table cell).
        default: the value when unset or empty, as the variable would spell it; None: unset.
        parse: the raw value -> the value the adapter uses; a ValueError's text says what is
            wrong, and :func:`value` names the variable.
        shown: the default as the documents say it, when it is not ``default`` itself.
        readers: the ``from_env`` functions that read it: ``server`` (``presets``), ``seed``,
            ``omlx``.
    """

    name: str
    doc: str
    default: str | None = None
    parse: Callable[[str], Any] = _text
    shown: str = ""
    readers: tuple[str, ...] = ("server",)

    @property
    def default_doc(self) -> str:
        if self.shown:
            return self.shown
        return "none" if self.default is None else f"`{self.default}`"


V = Variable
SERVER, ALL = ("server",), ("server", "seed", "omlx")
VARIABLES: tuple[Variable, ...] = (
    V("PREFIXCACHE_SERVER_CMD", "the server command; set by `--prefixcache-server-cmd` and a "
      "matrix's `server_cmd` (`session/sources.py`, `session/targets.py`)",
      shown="none: this or the URL"),
    V("PREFIXCACHE_SERVER_URL", "a running server instead (used only without a command); its "
      "cold baseline needs `PREFIXCACHE_COLD=salt` or a `PREFIXCACHE_COLD_CMD`, and the audit "
      "the latter"),
    V("PREFIXCACHE_COLD", "the cold baseline: `reset` (a second server reset before every "
      "uncached request; restarted when it has no reset endpoint), `restart`, `server` (a "
      "second server that keeps no cache), `salt` (a fresh namespace on the same server)",
      "reset", _one_of("reset", "restart", "server", "salt")),
    V("PREFIXCACHE_COLD_CMD", "the second server's command", shown="the server command"),
    V("PREFIXCACHE_RESET_PATHS", "the reset endpoints, comma-separated `METHOD /path` (vLLM has "
      "three)", shown="`$PREFIXCACHE_RESET_METHOD $PREFIXCACHE_RESET_PATH`"),
    V("PREFIXCACHE_RESET_METHOD", "the method of one reset endpoint", "POST"),
    V("PREFIXCACHE_RESET_PATH", "the path of one reset endpoint", "/v1/cache/reset"),
    V("PREFIXCACHE_NAMESPACE_HEADER", "the header that carries a request's namespace (tenant)",
      shown="none: no namespaces sent"),
    V("PREFIXCACHE_NAMESPACE_FIELD", "the body field that carries it (vLLM: `cache_salt`)"),
    V("PREFIXCACHE_EXTRA_BODY", "a JSON object added to every request body; "
      "`--prefixcache-server-body` sets it (`session/sources.py`)", "{}", _json_object),
    V("PREFIXCACHE_PROMPT_IDS", "where the server says the prompt's token ids: `reply` (vLLM's "
      "`return_token_ids`) or `tokenize` (llama-server's `/tokenize`)", None,
      _one_of("reply", "tokenize")),
    V("PREFIXCACHE_IMAGE_TOKEN_ID", "the image placeholder id, for image spans in the server's "
      "ids", None, int),
    V("PREFIXCACHE_RENDER", "`text:DIR` or `vlm:DIR`: render token ids and image spans locally "
      "with that model directory (checked against the server's counts)"),
    V("PREFIXCACHE_VOCAB", "a model directory whose `tokenizer.json` names the ids of "
      "top_logprobs entries that carry none"),
    V("PREFIXCACHE_EXTENSIONS", "`1`: ask the reference server for its `prefixcache` reply "
      "object (token ids, spans, merges, logits)", "0", _switch),
    V("PREFIXCACHE_REUSE_REFERENCE", "the cache's design, the reference its efficiency and "
      "positive control are judged against: `token`, `snapshot` (hybrid or sliding-window "
      "models), `block`", "token", _one_of("token", "snapshot", "block")),
    V("PREFIXCACHE_BLOCK_SIZE", "with `block`: tokens per block", None, _at_least_one),
    V("PREFIXCACHE_MODEL", "the model directory the engine factories load "
      "(`reference_engine:default_engine`, the mutants, `python -m reference_engine.server`, "
      "the presets `reference_server`, `mlx_lm_server`, `mlx_vlm_server`, `seed_server`): a "
      "fixture's name or a directory; `--prefixcache-model` sets it, as an absolute path, for "
      "the session and its servers. Also sent as the request's `model` field (a value that "
      "names no directory is passed on as a served model's name)",
      shown="each engine's own fixture"),
    V("PREFIXCACHE_TOP_LOGPROBS", "top_logprobs asked for per step (mlx-lm allows at most 11)",
      "10", _at_least_one),
    V("PREFIXCACHE_CHECK_LABELS", "`0`: do not check that each step's token is the best of its "
      "own top_logprobs", "1", _switch),
    V("PREFIXCACHE_TEXT_ONLY", "`1`: send no image requests", "0", _switch),
    V("PREFIXCACHE_START_TIMEOUT", "seconds for a server's whole start, until `/health` "
      "answers: a server whose port was taken (`Address already in use`) is started again, at "
      "most 3 times within it; errors end with the server's log", f"{START_TIMEOUT:g}", _seconds),
    V("PREFIXCACHE_SERVER_ENV", "`K=V K=V` added to the servers' environment (`{home}` is the "
      "server's private HOME)"),
    V("PREFIXCACHE_TAP_SERVER", "`1`: the server commands run under the tap launcher "
      "(`{python} -m pytest_prefixcache.tap MODULE:FUNC ...`); read its records", "0", _switch),
    V("PREFIXCACHE_TAP_LOG", "with the tap, a JSON-lines file of the API's and the tap's reuse "
      "per request"),
    V("PREFIXCACHE_CLAIMS", "claim sources as JSON, checked against the tap "
      "([claims](#claims-what-a-server-reports-against-what-its-model-computed))"),
    V("PREFIXCACHE_DECODE_STEPS", "with claims, tokens asked for under the tap, for per-step "
      "alignment", "8", _at_least_one),
    V("PREFIXCACHE_AUDIT", "`0`: no fresh server per audited request (the verdict is then "
      "INCOMPLETE: cold baseline not checked)", "1", _switch, readers=ALL),
    V("PREFIXCACHE_AUDIT_SHARE", "`N`: one fresh server answers up to N audited requests that "
      "share nothing (no image, no first message), for servers slow to start", "1",
      _at_least_one),
    V("PREFIXCACHE_CONCURRENCY", "requests the server is sent at once; above 1, `test_waves` "
      "runs ([waves](#concurrent-service-waves)); also read by the `reference_server` preset",
      "1", _at_least_one, readers=ALL),
    V("PREFIXCACHE_BATCH_INVARIANT", "`1`: the server declares that a reply never depends on "
      "the requests in flight with it (the trait `batch_invariant`): a cold wave that differs "
      "from the same requests alone is then a batching fault, not the finding `batch "
      "non-invariance`", "0", _switch, readers=ALL),
    V("PREFIXCACHE_FORK", "`0`: start every server from scratch; `1`: fork `{python} -m MODULE` "
      "servers", None, _switch, shown="fork on Linux, not on macOS"),
    V("SEED_ENGINE", "`vllm-mlx` or `rapid-mlx`: the seed engine of "
      "`pytest_prefixcache.adapters.seed:from_env`", None, _one_of("vllm-mlx", "rapid-mlx"),
      readers=("seed",)),
    V("SEED_FLAGS", "the seed engine's command-line flags (one string)", "", readers=("seed",)),
    V("SEED_CLAIMS", "`0`: no claim sources", "1", _switch, readers=("seed",)),
    V("SEED_AUDIT_SHARE", "audited requests one fresh seed server may answer", "8",
      _at_least_one, readers=("seed",)),
    V("SEED_TAP", "`0`: no logit tap (rapid-mlx only)", "1", _switch, readers=("seed",)),
    V("SEED_DIR", "where the seed engines' venvs are (`engines/seed/run.sh install` makes "
      "them)", shown="`.engines/seed` of the checkout", readers=("seed",)),
    V("SEED_TAP_LOGS", "a directory that gets a JSON-lines file of the API's and the tap's "
      "reuse per request", readers=("seed",)),
    V("OMLX_FLAGS", "oMLX's command-line flags (one string), for "
      "`pytest_prefixcache.adapters.omlx:from_env`", "", readers=("omlx",)),
    V("OMLX_DIR", "where oMLX's venv is (`engines/omlx/install.sh` makes it)",
      shown="`.engines/omlx` of the checkout", readers=("omlx",)),
    V("OMLX_TAP_LOGS", "a directory that gets a JSON-lines file of the API's and the tap's "
      "reuse per request", readers=("omlx",)),
    V("OMLX_CLAIMS", "`0`: no claim sources", "1", _switch, readers=("omlx",)),
)  # fmt: skip
_BY_NAME = {v.name: v for v in VARIABLES}


def value(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The declared variable ``name``, parsed: its default when unset or empty (None when
    it has none), else an :class:`EngineError` that names the variable and its value."""
    var = _BY_NAME[name]
    raw = (os.environ if environ is None else environ).get(name, "")
    if raw == "":
        return None if var.default is None else var.parse(var.default)
    try:
        return var.parse(raw)
    except ValueError as exc:
        why = str(exc) if str(exc).startswith("is ") else f"is not valid ({exc})"
        raise EngineError(f"{name}={raw!r} {why}") from None


def concurrency_from_env() -> int:
    """``PREFIXCACHE_CONCURRENCY``: requests a server is sent at once (default 1)."""
    return int(value("PREFIXCACHE_CONCURRENCY"))


def batch_invariant_from_env() -> bool:
    """``PREFIXCACHE_BATCH_INVARIANT``: whether the server declares the trait
    ``batch_invariant`` (default no)."""
    return bool(value("PREFIXCACHE_BATCH_INVARIANT"))


def audit_share(name: str) -> int:
    """``name`` (``PREFIXCACHE_AUDIT_SHARE`` or ``SEED_AUDIT_SHARE``): audited requests one
    fresh server may answer, an int >= 1."""
    return int(value(name))


def markdown_table() -> str:
    """docs/adapters.md's table of the variables, from :data:`VARIABLES`."""
    rows = ["| variable | read by | what it does | default |", "| --- | --- | --- | --- |"]
    for v in VARIABLES:
        readers = ", ".join(f"`{r}`" for r in v.readers)
        rows.append(f"| `{v.name}` | {readers} | {v.doc} | {v.default_doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
