"""``mlx_lm.server`` with a prompt cache that holds nothing: the cold server of the mlx-lm
versions before 0.31.0, which have no ``--prompt-cache-size`` (mlx-lm commit 83ff9c96, #906).

Those versions build their cache in ``mlx_lm.server.run`` as ``LRUPromptCache()`` (read in
0.30.2 and 0.30.4: server.py, ``run``), a module-level name looked up at call time; ``main``
replaces it with :class:`NoPromptCache` (every lookup a miss, every insert dropped), then runs
the server's own ``main``. The preset runs it under the tap as it runs ``mlx_lm.server:main``
(``cold_module``), or with ``python -m`` without the tap.
"""

from __future__ import annotations

from typing import Any


def no_prompt_cache(base: type) -> type:
    """A subclass of the server's ``LRUPromptCache`` that finds nothing and stores nothing."""

    class NoPromptCache(base):  # type: ignore[valid-type,misc]
        def fetch_nearest_cache(self, model: Any, tokens: Any) -> tuple[None, Any]:
            return None, tokens

        def insert_cache(self, *args: Any, **kwargs: Any) -> None:
            return None

    return NoPromptCache


def main() -> Any:
    import mlx_lm.server as server

    base = getattr(server, "LRUPromptCache", None)
    if base is None:
        raise SystemExit(
            "engines/history/history_nocache.py: this mlx_lm.server has no LRUPromptCache "
            "(before 0.30?): its prompt cache cannot be switched off this way"
        )
    server.LRUPromptCache = no_prompt_cache(base)
    return server.main()


if __name__ == "__main__":
    main()
