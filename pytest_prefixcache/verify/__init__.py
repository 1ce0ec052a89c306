"""Driving an engine through a request stream: the verifier, its worker thread, its messages."""

from __future__ import annotations

from .verifier import Step, Verifier, VerifyOptions

__all__ = ["Step", "Verifier", "VerifyOptions"]
