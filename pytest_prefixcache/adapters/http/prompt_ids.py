"""The prompt's token ids and image spans, which the oracle measures reuse against.

From the server when it can say them (``source="reply"``: vLLM's ``return_token_ids`` puts
``prompt_token_ids`` in the reply, image pads expanded; ``source="tokenize"``: llama-server's
``/apply-template`` then ``/tokenize``, for text requests), else rendered locally (``render``,
see :mod:`.render`). A local render that disagrees with the server's ids, or whose length is
not ``usage.prompt_tokens``, is an EngineError that says where: never a silently dropped oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from ...errors import EngineError
from ...types import Request
from .chat import openai_messages
from .render import placeholder_runs
from .replies import Reply
from .server import http_json

__all__ = ["PromptIds", "Source", "Spans", "first_difference", "prompt_count"]

Spans = tuple[tuple[int, int, str], ...]
Source = Literal["reply", "tokenize"]
Render = Callable[[Request], tuple[list[int], Spans]]


def prompt_count(reported: int | None, ids: tuple[int, ...] | None) -> int | None:
    """``usage.prompt_tokens``, or the prompt's length where a server answers 0 for a prompt
    that has tokens: a 0 counts nothing (vllm-mlx's MLLM text route, 0.2.9 to 0.5.0, sets it
    only when its system-prompt cache branch runs), and the tap's record must still end at
    the length this returns, its input ids the prompt's."""
    return len(ids) if reported == 0 and ids else reported


def first_difference(a: list[int], b: list[int]) -> str:
    """Where two id lists first differ, in words."""
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return (
        f"first difference at position {i}: rendered {a[i : i + 8]} vs server {b[i : i + 8]} "
        f"({len(a)} rendered ids, {len(b)} from the server)"
    )


def _llama_tokenize(base: str, request: Request, timeout: float) -> list[int] | None:
    """llama-server's own ids for a text request (its chat template, then its tokenizer);
    None for a request with images (``/tokenize`` does not expand them)."""
    if request.images:
        return None
    # the same messages as the chat request: the server decides on a prefilled assistant turn
    body = {"messages": openai_messages(request)}
    status, reply = http_json("POST", base + "/apply-template", body, timeout=timeout)
    if status != 200 or not isinstance(reply, dict) or "prompt" not in reply:
        raise EngineError(f"{base}/apply-template answered {status}: {str(reply)[:300]}")
    tok = {"content": reply["prompt"], "add_special": True, "parse_special": True}
    status, reply = http_json("POST", base + "/tokenize", tok, timeout=timeout)
    if status != 200 or not isinstance(reply, dict) or "tokens" not in reply:
        raise EngineError(f"{base}/tokenize answered {status}: {str(reply)[:300]}")
    return [int(t) for t in reply["tokens"]]


class PromptIds:
    """Token ids and image spans of each request (see the module docstring).

    Args:
        source: where the server says its ids (``"reply"``, ``"tokenize"``), or None.
        render: a local renderer, checked against the server's ids when both exist.
        image_token_id: the placeholder id whose runs are the image spans in server ids.
    """

    def __init__(
        self,
        source: Source | None = None,
        render: Render | None = None,
        image_token_id: int | None = None,
    ) -> None:
        if source not in (None, "reply", "tokenize"):
            raise EngineError(f"prompt_ids={source!r} is not 'reply', 'tokenize' or None")
        self.source = source
        self.render = render
        self.image_token_id = image_token_id

    @property
    def active(self) -> bool:
        return self.source is not None or self.render is not None

    def server_ids(
        self, parsed: Reply, request: Request, base: str, timeout: float
    ) -> list[int] | None:
        if self.source == "reply":
            if parsed.prompt_token_ids is None:
                raise EngineError(
                    "prompt_ids='reply' but the reply has no prompt_token_ids (vLLM returns "
                    "them with return_token_ids: true)"
                )
            return list(parsed.prompt_token_ids)
        if self.source == "tokenize":
            return _llama_tokenize(base, request, timeout)
        return None

    def __call__(
        self, parsed: Reply, request: Request, base: str, timeout: float
    ) -> tuple[tuple[int, ...] | None, Spans | None]:
        server = self.server_ids(parsed, request, base, timeout)
        n = parsed.prompt_tokens
        if server is not None and n is not None and len(server) != n:
            raise EngineError(
                f"the server returned {len(server)} prompt token ids but usage.prompt_tokens={n}"
            )
        if self.render is not None:
            rendered, spans = self.render(request)
            rendered = [int(t) for t in rendered]
            if server is not None and rendered != server:
                raise EngineError(
                    "the local render of the request disagrees with the server's prompt token "
                    f"ids: {first_difference(rendered, server)}"
                )
            if server is None and n and len(rendered) != n:  # 0: no count (prompt_count)
                raise EngineError(
                    f"the local render has {len(rendered)} prompt tokens but the server's "
                    f"usage.prompt_tokens={n}: the render does not match this server (its "
                    "chat template, tokenizer or image token counts)"
                )
            return tuple(rendered), spans
        if server is None:
            return None, None
        return tuple(server), self._spans(server, request)

    def _spans(self, ids: list[int], request: Request) -> Spans | None:
        if not request.images:
            return ()
        if self.image_token_id is None:
            return None
        runs = placeholder_runs(ids, self.image_token_id)
        if len(runs) != len(request.images):
            raise EngineError(
                f"the server's prompt token ids hold {len(runs)} run(s) of the image token "
                f"{self.image_token_id} for {len(request.images)} image(s): {runs}"
            )
        return tuple((s, e, img.digest) for (s, e), img in zip(runs, request.images))
