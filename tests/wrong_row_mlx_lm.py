"""``mlx_lm.server`` 0.32.2 with mlx-lm #976 put back: the prompt cache a finished (or
checkpointed) request leaves in the server's cache is extracted from another row of its batch
(the next one holding at least as many positions, cut to this row's length), the bug
ml-explore/mlx-lm 23af8570 fixed. Alone in its batch a request stores its own row, so only
concurrent requests show it. Run it under the tap: ``python -m pytest_prefixcache.tap
wrong_row_mlx_lm:main --model DIR ...`` (with this directory on ``PYTHONPATH``)."""

from __future__ import annotations

from typing import Any


def _wrong_row(original: Any) -> Any:
    def extract_cache(self: Any, idx: int) -> list[Any]:
        own = original(self, idx)
        n = len(self.uids)
        for k in range(1, n):
            other = original(self, (idx + k) % n)
            if other and own and other[0].offset >= own[0].offset:
                for layer, mine in zip(other, own):
                    layer.trim(layer.offset - mine.offset)
                return other  # BUG: another request's KV under this request's tokens
        return own

    return extract_cache


def main() -> None:
    import importlib

    from mlx_lm import server

    generate = importlib.import_module("mlx_lm.generate")  # mlx_lm.generate is also a function

    for cls in (generate.GenerationBatch, generate.PromptProcessingBatch):
        cls.extract_cache = _wrong_row(cls.extract_cache)  # type: ignore[method-assign]
    server.main()
