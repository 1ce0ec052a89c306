"""Any OpenAI-compatible server, configured by the ``PREFIXCACHE_*`` variables (``from_env``)."""

from __future__ import annotations

import os
import shlex

from ...errors import EngineError
from ..environment import audit_share, batch_invariant_from_env, concurrency_from_env, value
from ..http.claims import ClaimWatch, sources_from_json
from ..http.openai import OpenAIEngine
from ..http.render import TextRenderer, VlmRenderer
from ..tolerances import model_dir_of, with_measured_rules

__all__ = ["from_env"]


def from_env() -> OpenAIEngine:
    """An adapter configured by environment variables (used by engines/seed/run.sh and
    ``--prefixcache-server-cmd``): the ``PREFIXCACHE_*`` variables that
    :data:`.environment.VARIABLES` declares (``PREFIXCACHE_SERVER_CMD`` or
    ``PREFIXCACHE_SERVER_URL``, the cold baseline, resets, namespaces, ids, the tap, claims...),
    each with its default and parser there; a bad value is an error naming the variable.

    The measured tolerance rule is the one a preset of the same server gets
    (:func:`.tolerances.with_measured_rules`): the library from the command's program, the
    family from its ``--model`` directory, else ``PREFIXCACHE_RENDER``'s, ``PREFIXCACHE_VOCAB``'s
    or ``PREFIXCACHE_MODEL``'s.
    """
    e = os.environ
    cmd, url = value("PREFIXCACHE_SERVER_CMD"), value("PREFIXCACHE_SERVER_URL")
    if not cmd and not url:
        raise EngineError("set PREFIXCACHE_SERVER_CMD (with {port}) or PREFIXCACHE_SERVER_URL")
    env = dict(kv.split("=", 1) for kv in shlex.split(value("PREFIXCACHE_SERVER_ENV") or ""))
    kind, _, model_dir = (value("PREFIXCACHE_RENDER") or "").partition(":")
    if kind not in ("", "text", "vlm"):
        raise EngineError(f"PREFIXCACHE_RENDER={kind}:... is not text:DIR or vlm:DIR")
    render: TextRenderer | VlmRenderer | None = None
    if kind:
        render = TextRenderer(model_dir) if kind == "text" else VlmRenderer(model_dir)
    resets = f"{value('PREFIXCACHE_RESET_METHOD')} {value('PREFIXCACHE_RESET_PATH')}"
    sources = value("PREFIXCACHE_CLAIMS")
    engine = OpenAIEngine(
        cmd or None,
        url=None if cmd else url,
        cold=value("PREFIXCACHE_COLD"),
        cold_cmd=value("PREFIXCACHE_COLD_CMD"),
        reset_paths=value("PREFIXCACHE_RESET_PATHS") or resets,
        namespace_header=value("PREFIXCACHE_NAMESPACE_HEADER"),
        namespace_field=value("PREFIXCACHE_NAMESPACE_FIELD"),
        extra_body=value("PREFIXCACHE_EXTRA_BODY"),
        prompt_ids=value("PREFIXCACHE_PROMPT_IDS"),
        image_token_id=value("PREFIXCACHE_IMAGE_TOKEN_ID"),
        check_labels=value("PREFIXCACHE_CHECK_LABELS"),
        model=value("PREFIXCACHE_MODEL"),
        top_logprobs=value("PREFIXCACHE_TOP_LOGPROBS"),
        tap=value("PREFIXCACHE_TAP_SERVER"),
        vocab=value("PREFIXCACHE_VOCAB"),
        supports_images=not value("PREFIXCACHE_TEXT_ONLY"),
        env=env,
        start_timeout=value("PREFIXCACHE_START_TIMEOUT"),
        render=render,
        tap_log=value("PREFIXCACHE_TAP_LOG"),
        extensions=value("PREFIXCACHE_EXTENSIONS"),
        audit=value("PREFIXCACHE_AUDIT"),
        fork=value("PREFIXCACHE_FORK"),
        reuse_reference=value("PREFIXCACHE_REUSE_REFERENCE"),
        block_size=value("PREFIXCACHE_BLOCK_SIZE"),
        concurrency=concurrency_from_env(),
        claims=ClaimWatch(
            sources_from_json(sources), decode_steps=value("PREFIXCACHE_DECODE_STEPS")
        )
        if sources
        else None,
    )
    engine.fresh_instance_share = audit_share("PREFIXCACHE_AUDIT_SHARE")
    engine.batch_invariant = batch_invariant_from_env()
    # the measured rule of the program the command runs on the model's family, as a preset
    # of the same server gets it: the model directory is the command's --model, else the one
    # the ids are rendered with, the vocabulary's, or PREFIXCACHE_MODEL's
    candidates = (model_dir_of(cmd or ""), model_dir, e.get("PREFIXCACHE_VOCAB", ""))
    found = next((d for d in (*candidates, e.get("PREFIXCACHE_MODEL", "")) if _is_dir(d)), None)
    return with_measured_rules(engine, cmd, model_dir=found)


def _is_dir(path: str) -> bool:
    return bool(path) and os.path.isdir(path)
