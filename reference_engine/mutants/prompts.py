"""Mutants of prompt rendering: classes 12 and 13 of the bug zoo (reuse lost, no error).

Both override only ``Engine.render``. Their answers are right; they throw reuse away because
the token ids of a request change for reasons that do not change the conversation.
"""

from __future__ import annotations

from pytest_prefixcache.types import Message, Request

from ..engine import Engine
from ..render import Rendered, render
from ..vision import Prepared

__all__ = ["HistoryRerendered", "VolatileHeaderKept", "billing_header"]


def billing_header(nonce: str) -> str:
    """A per-request header line like the one Claude Code puts in its system prompt."""
    return f"x-anthropic-billing-header: cc_version=2.0.14; cc_entrypoint=cli; cch={nonce};\n"


class VolatileHeaderKept(Engine):
    """Class 12, volatile prompt bytes: the system prompt's per-request
    ``x-anthropic-billing-header`` line is rendered instead of being normalised away.

    It changes on every request and sits at the top of the system prompt, so nothing after
    it is ever reused: 0% hits, no error. Reproduces waybarrios/vllm-mlx #90 (fixed by
    stripping the header, b9f2a5f) and jundot/omlx #2255.
    """

    def render(
        self,
        request: Request,
        prepared: dict[str, Prepared],
        *,
        use_cache: bool = True,
        template: bool = True,
    ) -> Rendered:
        return render(
            request,
            processor=self.model.processor,
            image_token_id=self.model.image_token_id,
            placeholder_count=lambda img: prepared[img.digest].count,
            normalize=False,  # BUG: volatile header lines are kept.
            template=template,
        )


THINK = "<think>\n\n</think>\n\n"


def _mark_latest_reply(request: Request) -> Request:
    """The latest assistant reply before the final user turn gets an (empty) think block;
    older replies do not, as Qwen3-style templates strip reasoning from older turns."""
    msgs = list(request.messages)
    last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
    latest = max((i for i, m in enumerate(msgs[:last_user]) if m.role == "assistant"), default=-1)
    if latest >= 0:
        m = msgs[latest]
        head, *rest = m.content
        if isinstance(head, str):
            msgs[latest] = Message(m.role, (THINK + head, *rest))
    return Request(tuple(msgs), request.namespace, request.max_new_tokens, request.adapter)


class HistoryRerendered(Engine):
    """Class 13, history re-rendered: the latest assistant reply is rendered with a think
    block that disappears once another turn is added.

    Each append-only next turn changes the token ids of the previous reply, so reuse stops at
    the start of that reply instead of covering the whole previous request. Reproduces
    jundot/omlx #637 (fixed in 53a20e9) and the Qwen3.5 think-stripping chat template.
    """

    def render(
        self,
        request: Request,
        prepared: dict[str, Prepared],
        *,
        use_cache: bool = True,
        template: bool = True,
    ) -> Rendered:
        # BUG: the history is rendered differently depending on how many turns follow it.
        return super().render(
            _mark_latest_reply(request), prepared, use_cache=use_cache, template=template
        )
