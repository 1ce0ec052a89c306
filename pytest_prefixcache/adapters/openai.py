"""``OpenAIEngine`` under its first import path; the adapter lives in :mod:`.http.openai`."""

from __future__ import annotations

from .http.openai import OpenAIEngine

__all__ = ["OpenAIEngine"]
