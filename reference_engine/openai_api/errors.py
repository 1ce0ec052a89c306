"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any

__all__ = ["APIError"]


class APIError(Exception):
    """A request this server refuses; ``body()`` is the reply, ``status`` its HTTP status.

    Args:
        message: what is wrong and, where it helps, what is accepted instead.
        status: the HTTP status. Default: ``400``.
        type: the OpenAI error type. Default: ``"invalid_request_error"``.
        param: the body field at fault (``"temperature"``, ``"messages[2].role"``). Default:
            None.
        code: a machine-readable reason (``"unsupported_value"``). Default: None.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON reply."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }
